"""Predict with the model a training run exported (``MODEL_DIR/export``, see
:mod:`tfscale.training.export`).

Examples::

    python -m tfscale.predict --model_dir=runs/digits photo.png other.jpg
    python -m tfscale.predict --model_dir=runs/digits --top_k=3 my_images/   # a folder, recursively

Classification prints one line per image: its path, then the ``--top_k`` classes with their
probabilities, named as in the converter's ``manifest.json`` (or the class folders of an
``image_folder`` run), by class index otherwise. Segmentation writes each input's per-pixel
classes as an 8-bit PNG (pixel value = class) under ``--output_dir`` and prints where. Images
are JPEG, PNG, GIF or BMP, decoded to the channels the model was trained on; segmentation also
reads ``.npy`` arrays ``[H, W, C]``. The exported model applies evaluation's crop, resize and
normalization itself.

Bad usage (no exported model, a missing or unreadable image, ...) exits 2 with one line;
help, a missing model and missing images answer before TensorFlow loads. When the reader of
its output goes away (``| head``), it stops there quietly with exit code 0 (segmentation: the
PNGs of the lines printed are written).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import app  # noqa: E402
from absl import flags as absl_flags  # noqa: E402

from tfscale.cli import command, output  # noqa: E402

# Before importing input_pipelines: python -m puts the user's directory, which may have a
# package of that name, first on sys.path.
command.own_top_level_packages()

from input_pipelines.core.class_folders import IMAGE_SUFFIXES, check_signature  # noqa: E402
from input_pipelines.core.errors import CorruptFileError  # noqa: E402
from tfscale.cli.command import parse_flags  # noqa: E402
from tfscale.config.errors import EXIT_USAGE  # noqa: E402
from tfscale.training.export import EXPORT, INFO  # noqa: E402

FLAGS = absl_flags.FLAGS
ARRAY_SUFFIXES = (".npy",)  # segmentation samples of any channel count


def define_flags() -> None:
    """Defines this command's flags (called by :func:`entry` only, so importing the module
    defines none)."""
    absl_flags.DEFINE_string("model_dir", None, "The model_dir of a finished training run: "
                             f"its {EXPORT}/ holds the exported model.")
    absl_flags.DEFINE_integer("top_k", 5, "Classes printed per image, most probable first "
                              "(classification).", lower_bound=1)
    absl_flags.DEFINE_integer("batch_size", 32, "Images of the same size per call of the "
                              "model.", lower_bound=1)
    absl_flags.DEFINE_string("output_dir", "", "Segmentation: where the per-pixel class PNGs "
                             "go (default MODEL_DIR/predictions).")


def read_info(model_dir: str) -> dict[str, Any]:
    """The ``inference.json`` of ``model_dir``'s export.

    Raises:
        ValueError: no such model_dir, or it holds no exported model (saying why that may be).
    """
    if not model_dir:
        raise ValueError("--model_dir is required: the model_dir of a finished training run")
    if not os.path.isdir(model_dir):
        raise ValueError(f"--model_dir={model_dir} does not exist or is not a folder")
    path = Path(model_dir) / EXPORT / INFO
    if not path.is_file():
        raise ValueError(f"--model_dir={model_dir} holds no exported model ({path} is missing): "
                         "train into it to the end with python -m tfscale.train on real data "
                         "(runs on generated data such as --dataset=synthetic export none)")
    try:
        info: dict[str, Any] = json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON ({err}); train again to rewrite it") from None
    return info


def list_inputs(args: Sequence[str], suffixes: tuple[str, ...]) -> list[Path]:
    """The files of ``args``, in order; a folder gives its files with ``suffixes``, recursively
    and sorted.

    Raises:
        ValueError: no arguments, a path that does not exist, a folder without such files, or
            a named file that is not an image (checked by its first bytes).
    """
    if not args:
        raise ValueError("give the images to predict: IMAGE... or a FOLDER of images")
    found: list[Path] = []
    for arg in args:
        path = Path(arg)
        if path.is_dir():
            files = sorted(p for p in path.rglob("*") if p.is_file() and
                           p.suffix.lower() in suffixes and not p.name.startswith("."))
            if not files:
                raise ValueError(f"{arg}: the folder holds no {' '.join(suffixes)} files")
            found.extend(files)
        elif path.is_file():
            found.append(path)
        else:
            raise ValueError(f"{arg}: no such file or folder")
    for path in found:
        if path.suffix.lower() not in ARRAY_SUFFIXES:
            try:
                check_signature(str(path))
            except CorruptFileError as err:
                raise ValueError(str(err)) from None
    return found


def load_input(path: Path, info: dict[str, Any]) -> Any:
    """The raw input of ``path`` as the export takes it: ``[H, W, C]`` of its dtype.

    Raises:
        ValueError: naming the file, when it does not decode or does not fit the model.
    """
    import numpy as np
    import tensorflow as tf

    channels = info["input"]["shape"][-1]
    if path.suffix.lower() in ARRAY_SUFFIXES:
        if info["task"] != "segmentation":
            raise ValueError(f"{path}: arrays are read for segmentation models only; give "
                             "images")
        try:
            raw = np.load(path)
        except (OSError, ValueError) as err:
            raise ValueError(f"{path}: cannot read the array: {err}") from None
        if raw.ndim != 3 or raw.shape[-1] != channels:
            raise ValueError(f"{path}: an array of shape {raw.shape}; the model takes "
                             f"[H, W, {channels}]")
    else:
        try:
            raw = tf.io.decode_image(path.read_bytes(), channels=channels,
                                     expand_animations=False).numpy()
        except tf.errors.InvalidArgumentError as err:
            first = str(err.message).splitlines()[0] if err.message else "invalid data"
            raise ValueError(f"{path}: cannot decode the image: {first}") from None
    size = info["image_size"]
    if info["task"] == "segmentation" and min(raw.shape[:2]) < size:
        raise ValueError(f"{path}: {raw.shape[0]}x{raw.shape[1]} is smaller than the "
                         f"{size}x{size} the model was trained on")
    return raw.astype(info["input"]["dtype"])


def batches(paths: Sequence[Path], info: dict[str, Any], size: int
            ) -> Iterator[tuple[list[Path], Any]]:
    """Consecutive inputs of one shape, at most ``size`` at a time, stacked."""
    import numpy as np

    group: list[Path] = []
    arrays: list[Any] = []
    for path in paths:
        raw = load_input(path, info)
        if arrays and (raw.shape != arrays[0].shape or len(arrays) == size):
            yield group, np.stack(arrays)
            group, arrays = [], []
        group.append(path)
        arrays.append(raw)
    if arrays:
        yield group, np.stack(arrays)


def class_name(info: dict[str, Any], index: int) -> str:
    """The name of class ``index`` (its index when the data recorded no names)."""
    names = info.get("classes") or []
    return str(names[index]) if index < len(names) else str(index)


def classification_lines(paths: Sequence[Path], probabilities: Any, names: Sequence[str],
                         top_k: int) -> list[str]:
    """``PATH  NAME P  NAME P ...`` for each image, most probable class first."""
    import numpy as np

    lines = []
    for path, row in zip(paths, probabilities, strict=True):
        order = np.argsort(-row, kind="stable")[:top_k]
        lines.append("  ".join([str(path), *(f"{names[i]} {row[i]:.3f}" for i in order)]))
    return lines


def segmentation_output(path: Path, output_dir: Path, args: Sequence[str]) -> Path:
    """Where the class PNG of input ``path`` goes: its path under the folder argument it was
    found in (its name for a file argument), with ``.png``."""
    for arg in args:
        folder = Path(arg)
        if folder.is_dir() and folder in path.parents:
            return output_dir / path.relative_to(folder).with_suffix(".png")
    return output_dir / path.with_suffix(".png").name


@output.ends_quietly
def main(argv: list[str]) -> int:
    try:
        info = read_info(FLAGS.model_dir)
        segmentation = info["task"] == "segmentation"
        suffixes = IMAGE_SUFFIXES + (ARRAY_SUFFIXES if segmentation else ())
        paths = list_inputs(argv[1:], suffixes)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    command.import_tensorflow()
    import numpy as np
    import tensorflow as tf

    export = Path(FLAGS.model_dir) / EXPORT
    served = tf.saved_model.load(str(export))
    classes = int(info["num_classes"])
    named = f"names from {info['classes_from']}" if info.get("classes") else "class indices"
    print(f"{export}: --model={info['model']} trained on --dataset={info['dataset']} to step "
          f"{info['step']}; {classes} classes ({named})", file=sys.stderr, flush=True)
    names = [class_name(info, i) for i in range(classes)]
    output_dir = Path(FLAGS.output_dir or Path(FLAGS.model_dir) / "predictions")
    try:
        for group, raw in batches(paths, info, FLAGS.batch_size):
            probabilities = served.serve(tf.constant(raw))["probabilities"].numpy()
            if not segmentation:
                print("\n".join(classification_lines(group, probabilities, names, FLAGS.top_k)),
                      flush=True)
                continue
            for path, per_pixel in zip(group, probabilities, strict=True):
                labels = per_pixel.argmax(-1).astype(np.uint8 if classes <= 256 else np.uint16)
                out = segmentation_output(path, output_dir, argv[1:])
                out.parent.mkdir(parents=True, exist_ok=True)
                out.write_bytes(tf.io.encode_png(labels[..., None]).numpy())
                shares = np.bincount(labels.ravel(), minlength=classes) / labels.size
                shown = "  ".join(f"{names[c]} {shares[c]:.1%}" for c in np.argsort(-shares)
                                  if shares[c] > 0)
                print(f"{path} -> {out} ({labels.shape[0]}x{labels.shape[1]}: {shown})",
                      flush=True)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return EXIT_USAGE
    return 0


def entry() -> None:
    """The ``python -m tfscale.predict`` command (installed as ``tfscale-predict``)."""
    define_flags()
    command.absl_help("tfscale.predict", __doc__ or "", define_flags.__module__)
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    entry()
