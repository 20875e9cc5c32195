"""Look at what a classification run will train and evaluate on: a PNG grid of images.

    python -m input_pipelines.tools.preview --data_dir=/data/digits-tfr --out=grid.png \\
        [--rows=4 --columns=8] [any train flag]

Builds the ``train`` and ``validation`` pipelines exactly as ``python -m tfscale.train`` would
with the same flags (every training flag works: ``--dataset``, chosen from what ``--data_dir``
holds when left out; ``--image_size``, ``--num_classes`` and ``--input_channels``, taken from
the data when left out; ``--augment``, ``--horizontal_flip``, ``--eval_crop_fraction``,
``--normalization``, ...), takes ``rows x columns`` images of each, undoes the normalization for
display, and writes one PNG: a section marked TRAIN (training images as augmented, if they are;
a small dataset repeats, so the same image appears in several epochs' variants) above a section
marked EVAL. Each tile is labelled with its
class: the index and, where the data records them (the converter's manifest, the class folders),
the name. Prints the resolved preprocessing (on stderr, as training does) and the path
written.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
from absl import flags  # noqa: E402

from input_pipelines.core.errors import DataError  # noqa: E402
from input_pipelines.core.preprocessing_choice import Preprocessing, preprocessing_for  # noqa: E402
from input_pipelines.registry import inference_for  # noqa: E402
from input_pipelines.tools import parse_tool_flags  # noqa: E402
from tfscale.cli.flags import config_from_flags, define_flags  # noqa: E402
from tfscale.config.settings import DataSettings  # noqa: E402
from tfscale.config.tasks import CLASSIFICATION
from tfscale.config.train_config import TrainConfig  # noqa: E402

MIN_TILE = 64  # small images are enlarged (by whole pixels) to at least this size
GAP = 2  # pixels between tiles
BACKGROUND = 96
SCALE = 2  # pixels per dot of the label font
# A 5x7 dot font for the section labels (rows top to bottom, "#" = ink).
GLYPHS = {
    "T": ("#####", "..#..", "..#..", "..#..", "..#..", "..#..", "..#.."),
    "R": ("####.", "#...#", "#...#", "####.", "#.#..", "#..#.", "#...#"),
    "A": (".###.", "#...#", "#...#", "#####", "#...#", "#...#", "#...#"),
    "I": (".###.", "..#..", "..#..", "..#..", "..#..", "..#..", ".###."),
    "N": ("#...#", "##..#", "#.#.#", "#..##", "#...#", "#...#", "#...#"),
    "E": ("#####", "#....", "#....", "####.", "#....", "#....", "#####"),
    "V": ("#...#", "#...#", "#...#", "#...#", "#...#", ".#.#.", "..#.."),
    "L": ("#....", "#....", "#....", "#....", "#....", "#....", "#####"),
}
BAND = 7 * SCALE + 2 * 3  # height of a section's label band
LABEL = 12  # height of the strip under each tile with its class


def label_band(text: str, width: int) -> np.ndarray:
    """A ``BAND x width`` RGB strip with ``text`` (letters of :data:`GLYPHS`) in white."""
    band = np.full((BAND, width, 3), BACKGROUND // 2, np.uint8)
    x = GAP + 2
    for letter in text:
        dots = np.array([[c == "#" for c in row] for row in GLYPHS[letter]])
        ink = np.kron(dots, np.ones((SCALE, SCALE), bool))
        region = band[3:3 + ink.shape[0], x:x + ink.shape[1]]
        region[ink[:, :region.shape[1]]] = 255
        x += ink.shape[1] + SCALE
    return band


def to_pixels(images: np.ndarray, preprocessing: Preprocessing) -> np.ndarray:
    """Normalized float images ``[N, H, W, C]`` back to uint8 RGB pixels."""
    pixels = images * np.asarray(preprocessing.std) + np.asarray(preprocessing.mean)
    pixels = np.clip(np.rint(pixels), 0, 255).astype(np.uint8)
    return np.repeat(pixels, 3, axis=-1) if pixels.shape[-1] == 1 else pixels


def tile_label(text: str, width: int) -> np.ndarray:
    """A ``LABEL x width`` RGB strip with ``text`` in white, cut to fit (Pillow's default
    font)."""
    from PIL import Image, ImageDraw

    strip = Image.new("RGB", (width, LABEL), (BACKGROUND // 2,) * 3)
    draw = ImageDraw.Draw(strip)
    while len(text) > 1 and draw.textlength(text) > width - 2:
        text = text[:-1]
    draw.text((1, 0), text, fill=(255, 255, 255))
    return np.asarray(strip)


def class_labels(labels: np.ndarray, classes: Sequence[str] | None) -> list[str]:
    """Each tile's label: ``"3: cat"`` with the class names, ``"3"`` without (or when the
    name is the index)."""
    named = [(k, classes[k] if classes and 0 <= k < len(classes) else str(k))
             for k in (int(v) for v in labels)]
    return [name if name == str(k) else f"{k}: {name}" for k, name in named]


def tile_grid(pixels: np.ndarray, rows: int, columns: int,
              labels: Sequence[str] = ()) -> np.ndarray:
    """``rows x columns`` uint8 images ``[N, S, S, 3]`` as one image, enlarged to at least
    :data:`MIN_TILE` a side, :data:`GAP` pixels apart, each with its label in a strip of
    :data:`LABEL` pixels below it."""
    zoom = max(1, -(-MIN_TILE // pixels.shape[1]))
    tile = pixels.shape[1] * zoom
    pitch = tile + LABEL + GAP
    grid = np.full((rows * pitch + GAP, columns * (tile + GAP) + GAP, 3), BACKGROUND, np.uint8)
    for k, image in enumerate(pixels[:rows * columns]):
        top = GAP + (k // columns) * pitch
        left = GAP + (k % columns) * (tile + GAP)
        grid[top:top + tile, left:left + tile] = image.repeat(zoom, 0).repeat(zoom, 1)
        if k < len(labels):
            grid[top + tile:top + tile + LABEL, left:left + tile] = tile_label(labels[k], tile)
    return grid


def images_of(config: TrainConfig, split: str, count: int) -> tuple[np.ndarray, np.ndarray]:
    """The first ``count`` images of ``split`` from the pipeline training would build, and
    their labels."""
    from input_pipelines import PIPELINES, Shard

    batches = PIPELINES.get(config.dataset)(config, Shard(), split, count)
    images, labels = next(iter(batches.dataset.take(1)))
    return images.numpy(), labels.numpy()


def preview(config: TrainConfig, out: str, rows: int, columns: int) -> Preprocessing:
    """Writes the TRAIN/EVAL grid of ``config``'s pipelines to the PNG file ``out``.

    Returns:
        The resolved preprocessing shown.

    Raises:
        ValueError: a dataset that is not image classification, or a bad flag or file.
    """
    import tensorflow as tf

    from input_pipelines import task_of

    if task_of(config.dataset) != CLASSIFICATION or config.input_channels not in (1, 3):
        raise ValueError(f"--dataset={config.dataset} with --input_channels="
                         f"{config.input_channels}: the preview shows classification images "
                         "of 1 or 3 channels")
    from input_pipelines.core.image_preprocessing import announce

    preprocessing = preprocessing_for(DataSettings.of(config))
    announce(preprocessing)
    inference = inference_for(config)
    classes = inference.classes if inference is not None else None
    sections = []
    for split, label in (("train", "TRAIN"), ("validation", "EVAL")):
        try:
            images, labels = images_of(config, split, rows * columns)
        except DataError as err:
            if split == "train":
                raise
            print(f"note: no evaluation images shown: {err}", file=sys.stderr)
            continue
        grid = tile_grid(to_pixels(images, preprocessing), rows, columns,
                         class_labels(labels, classes))
        sections += [label_band(label, grid.shape[1]), grid]
    tf.io.write_file(out, tf.io.encode_png(np.concatenate(sections)))
    return preprocessing


def main(argv: Sequence[str]) -> int:
    values = flags.FlagValues()
    define_flags(values)
    flags.DEFINE_string("out", "preview.png", "PNG file to write.", flag_values=values)
    flags.DEFINE_integer("rows", 4, "Rows of images per section.", lower_bound=1,
                         flag_values=values)
    flags.DEFINE_integer("columns", 8, "Images per row.", lower_bound=1, flag_values=values)
    try:
        if parse_tool_flags(values, argv, __doc__):
            return 0
        from input_pipelines import shapes_from_data
        from tfscale.cli.plugins import choose_dataset

        config = config_from_flags(values, choose_dataset, shapes_from_data)
        preprocessing = preview(config, values.out, values.rows, values.columns)
    except (ValueError, flags.Error) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"wrote {values.out}: TRAIN ({training_images(preprocessing)}) above EVAL, "
          f"{values.rows} x {values.columns} each, labelled with their class")
    return 0


def training_images(preprocessing: Preprocessing) -> str:
    """What the TRAIN section shows, in words: augmented how, or not at all."""
    if preprocessing.augment == "none" and not preprocessing.flip:
        return "training images as the model gets them, not augmented: --augment=none"
    flips = " with random flips" if preprocessing.flip else ""
    return f"training images augmented by --augment={preprocessing.augment}{flips}"


if __name__ == "__main__":
    sys.exit(main(sys.argv))
