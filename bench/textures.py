"""A second small real image dataset with no download: texture tiles from scikit-image.

scikit-image ships three 512x512 grey photographs of textures inside the package (brick, grass,
gravel). Each is cut into non-overlapping ``size`` x ``size`` tiles (256 per class at 32 px),
written as a user's folder of PNGs (one sub-folder per texture) and converted with
``python -m input_pipelines.tools.folder_to_tfrecord --validation_fraction 0.2``, as
:mod:`bench.digits` does. Unlike the digits, whose strokes fill their frame, a texture has no
frame: any shift of a tile is another valid tile, so the two datasets bracket what a shift
augmentation does to small images.

    python -m bench.textures --out /tmp/textures [--size 32]   # prints the TFRecord directory

Needs scikit-image (requirements-bench.txt).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from bench.digits import command_line, convert, write_pngs

TEXTURES = ("brick", "grass", "gravel")
CLASSES = len(TEXTURES)


def texture_tiles(size: int) -> tuple[np.ndarray, np.ndarray]:
    """Every tile as uint8 ``[N, size, size]`` with int labels ``[N]`` (index in TEXTURES)."""
    try:
        from skimage import data
    except ImportError as error:
        raise SystemExit("bench.textures needs scikit-image: pip install -r "
                         "requirements-bench.txt") from error
    tiles, labels = [], []
    for label, name in enumerate(TEXTURES):
        photo = getattr(data, name)()
        rows, cols = photo.shape[0] // size, photo.shape[1] // size
        for r in range(rows):
            for c in range(cols):
                tiles.append(photo[r * size:(r + 1) * size, c * size:(c + 1) * size])
                labels.append(label)
    return np.stack(tiles).astype(np.uint8), np.asarray(labels)


def prepare(out: Path, size: int = 32, shards: int = 4) -> Path:
    """The tiles as TFRecord shards for ``--dataset=imagenet`` (made once); returns their
    directory."""
    records = out / "tfrecord"
    if not (records / "manifest.json").exists():
        images, labels = texture_tiles(size)
        convert(write_pngs(out / "png", images, labels, TEXTURES), records, shards)
    return records


def main() -> None:
    command_line(__doc__, prepare)


if __name__ == "__main__":
    main()
