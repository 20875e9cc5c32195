"""A small real image dataset with no download: scikit-learn's handwritten digits as a user's
folder of PNGs, converted the way a user converts their own folder.

scikit-learn ships 1,797 labelled 8x8 digit scans (16 grey levels) inside the package. They are
upscaled (bilinear) to ``size`` x ``size`` 8-bit PNGs in one sub-folder per class, then
``python -m input_pipelines.tools.folder_to_tfrecord --validation_fraction 0.2`` holds out a
fifth of each class and writes TFRecord shards with ``manifest.json``.

    python -m bench.digits --out /tmp/digits [--size 32]   # prints the TFRecord directory

Needs scikit-learn (in requirements-dev.txt: the test and benchmark environment only).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
CLASSES = 10


def digit_images(size: int) -> tuple[np.ndarray, np.ndarray]:
    """All digits as uint8 ``[N, size, size]`` images with int labels ``[N]``."""
    import tensorflow as tf
    from sklearn.datasets import load_digits

    digits = load_digits()
    scans = digits.images[..., None].astype(np.float32) * (255.0 / 16.0)
    images = tf.image.resize(scans, [size, size], method="bilinear").numpy()
    return np.clip(np.rint(images[..., 0]), 0, 255).astype(np.uint8), digits.target


def write_folder(out: Path, size: int) -> Path:
    """Writes ``out/png/<digit>/<index>.png`` (skipped when already there); returns the folder."""
    import tensorflow as tf

    folder = out / "png"
    if (folder / "done").exists():
        return folder
    images, labels = digit_images(size)
    for index, (image, label) in enumerate(zip(images, labels, strict=True)):
        path = folder / str(label) / f"{index:04d}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(tf.io.encode_png(image[..., None]).numpy())
    (folder / "done").write_text("")
    return folder


def prepare(out: Path, size: int = 32, shards: int = 4) -> Path:
    """The digits as TFRecord shards for ``--dataset=imagenet`` (made once); returns their
    directory. ``shards`` train and validation shards, so each of 2 workers reads its own."""
    records = out / "tfrecord"
    if not (records / "manifest.json").exists():
        folder = write_folder(out, size)
        subprocess.run(
            [sys.executable, "-m", "input_pipelines.tools.folder_to_tfrecord", "--input_dir",
             str(folder), "--output_dir", str(records), "--shards", str(shards),
             "--validation_shards", str(shards), "--validation_fraction", "0.2",
             "--encoding", "keep"], cwd=ROOT, check=True, capture_output=True)
    return records


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--size", type=int, default=32)
    args = parser.parse_args()
    print(prepare(args.out, args.size))


if __name__ == "__main__":
    main()
