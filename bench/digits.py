"""A small real image dataset with no download: scikit-learn's handwritten digits as a user's
folder of PNGs, converted the way a user converts their own folder.

scikit-learn ships 1,797 labelled 8x8 digit scans (16 grey levels) inside the package. They are
upscaled (bilinear) to ``size`` x ``size`` 8-bit PNGs in one sub-folder per class, then
``python -m input_pipelines.tools.folder_to_tfrecord --validation_fraction 0.2`` holds out a
fifth of each class and writes TFRecord shards with ``manifest.json``.

    python -m bench.digits --out /tmp/digits [--size 32]   # prints the TFRecord directory

Needs scikit-learn's data file only: ``launch/setup.sh`` installs the package outside the import
path (requirements-data.txt, see :func:`load_digits`); an importable scikit-learn works too.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CLASSES = 10
# Where launch/setup.sh installs requirements-data.txt: inside the venv but off its import path,
# because Keras imports scikit-learn at start-up whenever it can (about a second of every
# TensorFlow process's start).
DATA_PACKAGES = Path(sys.prefix) / "data-packages"
DIGITS_CSV = Path("sklearn", "datasets", "data", "digits.csv.gz")


def digits_file() -> Path:
    """scikit-learn's ``digits.csv.gz``: in :data:`DATA_PACKAGES`, else in an importable
    scikit-learn (found without importing it)."""
    places = [DATA_PACKAGES / DIGITS_CSV]
    spec = importlib.util.find_spec("sklearn")
    if spec is not None and spec.submodule_search_locations:
        places.append(Path(list(spec.submodule_search_locations)[0]).parent / DIGITS_CSV)
    for path in places:
        if path.is_file():
            return path
    raise SystemExit(f"scikit-learn's digits are not installed ({' or '.join(map(str, places))}"
                     "): run launch/setup.sh, or pip install scikit-learn")


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's 1,797 digits, as its ``load_digits()`` has them: float ``[N, 8, 8]``
    images of 0-16 grey levels and int labels ``[N]``, read from the package's data file."""
    table = np.loadtxt(digits_file(), delimiter=",")
    return table[:, :-1].reshape(-1, 8, 8), table[:, -1].astype(int)


def digit_images(size: int) -> tuple[np.ndarray, np.ndarray]:
    """All digits as uint8 ``[N, size, size]`` images with int labels ``[N]``."""
    import tensorflow as tf

    grey, labels = load_digits()
    scans = grey[..., None].astype(np.float32) * (255.0 / 16.0)
    images = tf.image.resize(scans, [size, size], method="bilinear").numpy()
    return np.clip(np.rint(images[..., 0]), 0, 255).astype(np.uint8), labels


def write_folder(out: Path, size: int) -> Path:
    """Writes ``out/png/<digit>/<index>.png`` (skipped when already there); returns the folder."""
    folder = out / "png"
    if (folder / "done").exists():
        return folder
    return write_pngs(folder, *digit_images(size))


def write_pngs(folder: Path, images: np.ndarray, labels: np.ndarray,
               names: tuple[str, ...] = ()) -> Path:
    """Writes uint8 ``images`` ``[N, H, W]`` as ``folder/<class>/<index>.png`` (a user's class
    folders; ``<class>`` is ``names[label]``, or the label) and marks the folder done; returns
    it."""
    import tensorflow as tf

    for index, (image, label) in enumerate(zip(images, labels, strict=True)):
        path = folder / (names[label] if names else str(label)) / f"{index:04d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(tf.io.encode_png(image[..., None]).numpy())
    (folder / "done").write_text("")
    return folder


def prepare(out: Path, size: int = 32, shards: int = 4) -> Path:
    """The digits as TFRecord shards for ``--dataset=imagenet`` (made once); returns their
    directory. ``shards`` train and validation shards, so each of 2 workers reads its own."""
    records = out / "tfrecord"
    if not (records / "manifest.json").exists():
        convert(write_folder(out, size), records, shards)
    return records


def convert(folder: Path, records: Path, shards: int) -> None:
    """``folder_to_tfrecord`` with a fifth of each class held out for validation."""
    subprocess.run(
        [sys.executable, "-m", "input_pipelines.tools.folder_to_tfrecord", "--input_dir",
         str(folder), "--output_dir", str(records), "--shards", str(shards),
         "--validation_shards", str(shards), "--validation_fraction", "0.2",
         "--encoding", "keep"], cwd=ROOT, check=True, capture_output=True)


def command_line(doc: str, make: Callable[[Path, int], Path]) -> None:
    """A dataset module's ``--out DIR [--size N]`` command: makes the data, prints its
    TFRecord directory."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--size", type=int, default=32)
    args = parser.parse_args()
    print(make(args.out, args.size))


def main() -> None:
    command_line(__doc__, prepare)


if __name__ == "__main__":
    main()
