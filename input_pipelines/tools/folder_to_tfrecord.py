"""Convert image folders (one sub-folder per class) to ImageNet-style TFRecord shards.

    python -m input_pipelines.tools.folder_to_tfrecord --input_dir /data/pets \\
        --output_dir /data/pets-tfrecord --shards 16 [--validation_shards 2] [--encoding jpeg]

Reads ``INPUT_DIR/CLASS/*`` (or ``INPUT_DIR/{train,validation}/CLASS/*``; without a validation
folder, ``--validation_fraction`` holds out that fraction of each class), shuffles each split
with ``--seed`` and writes balanced shards of ``tf.train.Example`` records (``image/encoded``,
``image/format``, ``image/class/label``, ``image/class/text``, ``image/height``, ``image/width``,
``image/filename``) plus ``manifest.json``, for ``--dataset=imagenet``. Every image is decoded
on the way: one that does not decode stops the conversion naming it. The training images' pixel
statistics (per-channel mean and standard deviation, 0-255, decoded to RGB and to grayscale) go
into the manifest's ``pixel_stats`` for ``--normalization=dataset``, and their sizes and
channels into its ``image_sizes``, from which training takes its default ``--image_size`` and
``--input_channels`` (and ``--num_classes`` from its ``classes``). ``--encoding=jpeg``
(default) keeps JPEG files byte for byte and re-encodes other formats as JPEG;
``--encoding=keep`` stores every file's bytes as they are (lossless for PNG). Re-running resumes:
finished shards whose inputs are unchanged are verified by checksum and skipped. Images are
decoded and encoded on ``--workers`` processes (default: every core), with a progress line of
images, images/s and the time left; the output is the same for any number of workers.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import os
import random
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from input_pipelines.core.class_folders import ImageFolder, check_signature, list_images
from input_pipelines.core.encode_pool import EncodePool
from input_pipelines.core.errors import DataError
from input_pipelines.core.image_sizes import KEY as SIZES_KEY
from input_pipelines.core.manifest import MANIFEST
from input_pipelines.core.preprocessing_choice import STATS_KEY
from input_pipelines.core.report import Progress
from input_pipelines.core.shard_writer import (
    converter_parser,
    load_manifest,
    run_converter,
    write_split,
)
from input_pipelines.core.stats import ImageStats
from tfscale.config.tasks import CLASSIFICATION
from tfscale.training.files import write_json_atomic

if TYPE_CHECKING:
    import numpy as np
    import tensorflow as tf

ENCODINGS = ("jpeg", "keep")
# In the identity of every training image: what its shard records beside the records.
TRAINING_MARKER = "|pixel_stats|image_sizes"


def _feature(value: bytes | int) -> tf.train.Feature:
    import tensorflow as tf

    if isinstance(value, bytes):
        return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))
    return tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))


def read_image(path: str) -> tuple[bytes, np.ndarray]:
    """The bytes of the image file at ``path`` and the pixels they decode to.

    Raises:
        DataError: the file is not an image or does not decode (naming ``path``).
    """
    import tensorflow as tf

    check_signature(path)
    with open(path, "rb") as f:
        encoded = f.read()
    try:
        image = tf.io.decode_image(encoded, expand_animations=False)
    except tf.errors.OpError as err:
        raise DataError(f"{path}: cannot decode the image: {err.message.splitlines()[0]}") from None
    return encoded, image.numpy()


def stored_image(path: str, encoding: str, quality: int,
                 stats: ImageStats | None = None) -> tuple[bytes, str, np.ndarray]:
    """The bytes to store for the image at ``path`` under ``encoding``, their format
    (``jpeg``, ``png`` ...) and the file's pixels; adds the stored pixels to ``stats``.

    Raises:
        DataError: the image does not decode (naming ``path``).
    """
    import tensorflow as tf

    encoded, image = read_image(path)
    stored: np.ndarray | None = image  # the pixels the stored bytes decode to
    is_jpeg = bool(tf.io.is_jpeg(encoded))
    if encoding == "jpeg" and not is_jpeg:
        if image.shape[-1] not in (1, 3):  # drop alpha: JPEG has none
            image = image[..., :3] if image.shape[-1] == 4 else image[..., :1]
        encoded = tf.io.encode_jpeg(image, quality=quality).numpy()
        is_jpeg = True
        stored = None  # the JPEG decodes a little differently: decode it for the statistics
    if stats is not None:
        stats.add(encoded, stored)
    return encoded, "jpeg" if is_jpeg else os.path.splitext(path)[1].lstrip(".").lower(), image


def image_example(path: str, label: int, class_name: str, name: str, encoding: str,
                  quality: int, stats: ImageStats | None = None) -> bytes:
    """The serialized example of the image at ``path``, adding the pixels stored to ``stats``.

    Raises:
        DataError: the image does not decode (naming ``path``).
    """
    import tensorflow as tf

    encoded, kind, image = stored_image(path, encoding, quality, stats)
    features = {
        "image/encoded": _feature(encoded), "image/format": _feature(kind.encode()),
        "image/class/label": _feature(label), "image/class/text": _feature(class_name.encode()),
        "image/height": _feature(int(image.shape[0])), "image/width": _feature(int(image.shape[1])),
        "image/filename": _feature(name.encode()),
    }
    example = tf.train.Example(features=tf.train.Features(feature=features))
    # Sorted features: the map order of a plain serialization differs between processes.
    return example.SerializeToString(deterministic=True)


def hold_out(folder: ImageFolder, fraction: float, seed: int) -> tuple[ImageFolder, ImageFolder]:
    """Splits ``folder`` into training and validation images: ``fraction`` of each class (at
    least one image of a class that has two or more), chosen with ``seed``."""
    rng = random.Random(seed)
    train: list[int] = []
    validation: list[int] = []
    for label in range(len(folder.classes)):
        members = [i for i, lab in enumerate(folder.labels) if lab == label]
        rng.shuffle(members)
        count = min(len(members) - 1, max(1, round(fraction * len(members))))
        validation += members[:max(count, 0)]
        train += members[max(count, 0):]

    def subset(indices: list[int]) -> ImageFolder:
        indices = sorted(indices)
        return dataclasses.replace(folder, paths=[folder.paths[i] for i in indices],
                                   labels=[folder.labels[i] for i in indices])

    return subset(train), subset(validation)


def image_splits(input_dir: str, validation_fraction: float, seed: int) -> dict[str, ImageFolder]:
    """The images of each split of ``input_dir``: ``train`` and, from a ``validation/`` folder
    or held out with ``validation_fraction`` (see :func:`hold_out`), ``validation``.

    Raises:
        DataError: a bad folder, or a validation folder together with a fraction.
    """
    if not 0 <= validation_fraction < 1:
        raise DataError(f"--validation_fraction={validation_fraction} is not valid; expected a "
                        "fraction in [0, 1)")
    train = list_images(input_dir, "train", "--input_dir")
    has_validation = os.path.isdir(os.path.join(input_dir, "validation"))
    if has_validation and validation_fraction:
        raise DataError(f"{input_dir} has a validation/ folder; drop --validation_fraction or "
                        "the folder")
    if has_validation:
        return {"train": train,
                "validation": list_images(input_dir, "validation", "--input_dir")}
    if validation_fraction:
        train, held_out = hold_out(train, validation_fraction, seed)
        return {"train": train, "validation": held_out}
    print(f"note: {input_dir} has no validation/ folder: writing training images only "
          "(hold some out with --validation_fraction, or put them in "
          "INPUT_DIR/validation/CLASS/)", file=sys.stderr)
    return {"train": train}


def shuffled_items(folder: ImageFolder, input_dir: str, seed: int,
                   settings: str) -> tuple[list[tuple[str, int]], list[str]]:
    """The (path, label) pairs of ``folder`` shuffled with ``seed``, and each one's identity
    for resuming (its path, label, size and time, and the converter's ``settings``)."""
    order = list(range(len(folder.paths)))
    random.Random(seed).shuffle(order)
    items = [(folder.paths[i], folder.labels[i]) for i in order]
    identities = []
    for path, label in items:
        stat = os.stat(path)
        identities.append(f"{os.path.relpath(path, input_dir)}|{label}|{stat.st_size}|"
                          f"{stat.st_mtime_ns}|{settings}")
    return items, identities


def encode_image(item: tuple[str, int], stats: ImageStats | None, root: str,
                 classes: Sequence[str], encoding: str, quality: int) -> tuple[bytes, int, int]:
    """An :data:`~input_pipelines.core.encode_pool.Encode` of (path, label) items: the
    example of the image (named relative to ``root``), its label twice."""
    path, label = item
    record = image_example(path, label, classes[label], os.path.relpath(path, root), encoding,
                           quality, stats)
    return record, label, label


def convert(input_dir: str, output_dir: str, shards: int, validation_shards: int,
            encoding: str = "jpeg", quality: int = 95, seed: int = 0,
            validation_fraction: float = 0.0, workers: int = 1) -> dict[str, list[str]]:
    """Converts ``input_dir`` into shards under ``output_dir``, encoding on ``workers``
    processes.

    Returns:
        The shards skipped as already written, per split.

    Raises:
        DataError: a bad folder or image, or a bad argument.
    """
    check_encoding(encoding, ENCODINGS)
    if min(shards, validation_shards) < 1:
        raise DataError("--shards and --validation_shards must be at least 1")
    folders = image_splits(input_dir, validation_fraction, seed)
    train = folders["train"]
    splits = {"train": (train, shards)}
    if "validation" in folders:
        splits["validation"] = (folders["validation"], validation_shards)
    os.makedirs(output_dir, exist_ok=True)
    header: dict[str, Any] = {"task": CLASSIFICATION, "classes": train.classes,
                              "encoding": encoding}
    if validation_fraction:
        header["validation_fraction"] = validation_fraction
    manifest = load_manifest(output_dir, header)
    progress = Progress(f"writing {output_dir}", sum(len(f.paths) for f, _ in splits.values()),
                        0, unit="images")
    skipped = {}
    with EncodePool(workers) as pool:
        for split, (folder, count) in splits.items():
            # Training shards carry pixel statistics and image sizes; the marker makes shards
            # of converters that did not keep them be rewritten rather than skipped.
            marker = TRAINING_MARKER if split == "train" else ""
            items, identities = shuffled_items(folder, input_dir, seed,
                                               f"{encoding}|{quality}{marker}")
            encode = functools.partial(encode_image, root=folder.root, classes=folder.classes,
                                       encoding=encoding, quality=quality)
            skipped[split] = write_split(output_dir, manifest, split, items, identities,
                                         min(count, len(items)), encode,
                                         ImageStats if split == "train" else None, progress,
                                         pool)
    progress.done()
    training = ImageStats()
    for shard in manifest["splits"]["train"]["shards"]:
        training.merge(shard["stats"])
    manifest[STATS_KEY] = training.summary()
    manifest[SIZES_KEY] = training.sizes.to_dict()
    write_json_atomic(os.path.join(output_dir, MANIFEST), manifest)
    return skipped


def image_parser(prog: str, description: str, encodings: Sequence[str],
                 encoding_help: str, shards: bool = True) -> argparse.ArgumentParser:
    """The arguments of the converters of image folders (:func:`converter_parser`'s and the
    encoding, JPEG quality, seed and validation fraction)."""
    parser = converter_parser(prog, description, "Folder of class sub-folders.", shards)
    parser.add_argument("--encoding", default=encodings[0], choices=encodings,
                        help=encoding_help)
    parser.add_argument("--quality", type=int, default=95, help="JPEG quality of re-encoding.")
    parser.add_argument("--seed", type=int, default=0,
                        help="Seed of the record order and of --validation_fraction's choice.")
    parser.add_argument("--validation_fraction", type=float, default=0.0,
                        help="Without a validation/ folder: hold out this fraction of each "
                        "class for validation.")
    return parser


def check_encoding(encoding: str, encodings: Sequence[str]) -> None:
    """Raises ``DataError`` unless ``encoding`` is one of ``encodings``."""
    if encoding not in encodings:
        raise DataError(f"--encoding={encoding!r} is not valid; choose one of: "
                        f"{', '.join(encodings)}")


def main(argv: Sequence[str] | None = None) -> int:
    parser = image_parser("input_pipelines.tools.folder_to_tfrecord", __doc__.split("\n")[0],
                          ENCODINGS, "jpeg: store JPEG (re-encode other formats); keep: store "
                          "as is.")
    args = parser.parse_args(argv)
    return run_converter(args.output_dir, lambda: convert(
        args.input_dir, args.output_dir, args.shards, args.validation_shards, args.encoding,
        args.quality, args.seed, args.validation_fraction, args.workers))


if __name__ == "__main__":
    sys.exit(main())
