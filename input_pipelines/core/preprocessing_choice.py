"""Which preprocessing a classification run gets: the ``auto`` values of the flags resolved.

``--augment``, ``--horizontal_flip``, ``--eval_crop_fraction`` and ``--normalization`` default to
``auto``; :func:`resolve_preprocessing` turns them into one :class:`Preprocessing`, so the
pipelines, ``python -m input_pipelines.tools.preview``, the docs and the tests agree on the
defaults:

- augment: ``imagenet`` (random-resized crop) for ``--image_size >= 128``, else ``none`` (the
  whole image, as a plain Keras script trains): on two small real datasets every shift policy
  tried (pad-and-crop by 1/8 or 1/16 of the side, or ramped in over the run) slowed the time to
  accuracy and lowered the accuracy of a 10-epoch run (``bench.augment_policy``, ACCURACY.md);
  ``--augment=small`` (the CIFAR recipe) is for long runs on natural images;
- horizontal flip: on for ``imagenet``, ``small`` and ``flip``, never for ``none`` (so small
  images, often digits or letters that a mirror changes, are not mirrored unless asked);
  ``--horizontal_flip=on`` with ``--augment=auto`` on small images gives ``flip``;
- evaluation crop: 0.875 of the shorter side for ``--image_size >= 128`` (224 of 256), else the
  whole shorter side;
- normalization: the training data's own per-channel mean and standard deviation when the
  converter's ``manifest.json`` or the stats tool's ``stats.json`` records them, else ImageNet's.

Dataset statistics are in pixel units (0-255), as are all means and deviations here. Nothing in
this module needs TensorFlow.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from input_pipelines.core.errors import DataError
from input_pipelines.core.files import data_root
from input_pipelines.core.manifest import MANIFEST, read_json
from tfscale.config.settings import DataSettings

LARGE = 128  # images at least this many pixels a side get the ImageNet recipe
# Per-channel mean and standard deviation of ImageNet pixels scaled to [0, 1].
MEAN_RGB = (0.485, 0.456, 0.406)
STDDEV_RGB = (0.229, 0.224, 0.225)
MEAN_GRAY = (0.449,)
STDDEV_GRAY = (0.226,)
STATS_KEY = "pixel_stats"  # where manifest.json and stats.json keep image statistics
STATS_FILES = (MANIFEST, "stats.json")


@dataclasses.dataclass(frozen=True)
class PixelStats:
    """Per-channel statistics of a dataset's training images, in pixel units (0-255)."""

    path: str  # the file they were read from
    mean: tuple[float, ...]
    std: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class Preprocessing:
    """The resolved preprocessing of a classification run."""

    augment: str  # imagenet | small | flip | none
    flip: bool
    eval_crop_fraction: float
    normalization: str  # imagenet | dataset | none
    mean: tuple[float, ...]  # subtracted per channel, pixel units (0-255)
    std: tuple[float, ...]  # divided by per channel, pixel units
    stats_path: str = ""  # where the dataset statistics came from (normalization=dataset)

    def describe(self) -> str:
        """One line for the log, e.g. ``augment=small flip=off eval_crop=1 ...``."""
        where = f" from {self.stats_path}" if self.stats_path else ""
        mean = ", ".join(f"{m:.1f}" for m in self.mean)
        std = ", ".join(f"{s:.1f}" for s in self.std)
        return (f"preprocessing: augment={self.augment} flip={'on' if self.flip else 'off'} "
                f"eval_crop_fraction={self.eval_crop_fraction:g} "
                f"normalization={self.normalization}{where} (mean [{mean}], std [{std}] of "
                "0-255 pixels)")


def resolve_preprocessing(config: DataSettings, stats: PixelStats | None) -> Preprocessing:
    """Resolves the ``auto`` preprocessing flags of ``config`` (see the module docstring).

    Args:
        config: supplies augment, horizontal_flip, eval_crop_fraction, normalization,
            image_size, input_channels and data_dir (for messages).
        stats: the training data's statistics for ``config.input_channels`` channels, or
            ``None`` when there are none (see :func:`find_pixel_stats`).

    Raises:
        ValueError: ``--normalization=dataset`` without statistics (naming the files looked
            for and how to make them).
    """
    large = config.image_size >= LARGE
    augment = config.augment
    if augment == "auto":
        augment = "imagenet" if large else "flip" if config.horizontal_flip == "on" else "none"
    if config.horizontal_flip == "auto":
        flip = augment != "none"
    else:
        flip = config.horizontal_flip == "on"
    crop = config.eval_crop_fraction or (0.875 if large else 1.0)
    normalization = config.normalization
    if normalization == "auto":
        normalization = "dataset" if stats is not None else "imagenet"
    if normalization == "dataset":
        if stats is None:
            raise ValueError(
                f"--normalization=dataset: no statistics of the training images for "
                f"--input_channels={config.input_channels} in {' or '.join(STATS_FILES)} under "
                f"--data_dir={config.data_dir}; convert with python -m "
                "input_pipelines.tools.folder_to_tfrecord, or for an image folder run python -m "
                f"input_pipelines.tools.stats --data_dir {config.data_dir}, or choose "
                "--normalization=imagenet or none")
        return Preprocessing(augment, flip, crop, normalization, stats.mean, stats.std,
                             stats.path)
    if normalization == "none":
        channels = config.input_channels
        return Preprocessing(augment, flip, crop, normalization, (0.0,) * channels,
                             (255.0,) * channels)
    mean, std = (MEAN_RGB, STDDEV_RGB) if config.input_channels == 3 else (MEAN_GRAY, STDDEV_GRAY)
    return Preprocessing(augment, flip, crop, normalization, tuple(255 * m for m in mean),
                         tuple(255 * s for s in std))


def stats_entry(mean: Any, std: Any, pixels: int) -> dict[str, Any]:
    """One channel count's entry under ``pixel_stats``."""
    return {"pixels": int(pixels), "mean": [float(m) for m in mean],
            "std": [float(s) for s in std]}


def find_pixel_stats(data_dir: str, channels: int) -> PixelStats | None:
    """The training images' statistics for ``channels`` channels recorded beside ``data_dir``.

    Looks for ``pixel_stats`` in ``manifest.json`` then ``stats.json``, in the data folder
    and the one above it (for a ``SPLIT/`` folder or a glob inside one).

    Raises:
        DataError: a statistics file that is not valid JSON.
    """
    if not data_dir:
        return None
    root = data_root(data_dir)
    for folder in (root, os.path.dirname(os.path.abspath(root))):
        for name in STATS_FILES:
            path = os.path.join(folder, name)
            if not os.path.isfile(path):
                continue
            document = read_json(path)
            entry = document.get(STATS_KEY, {}).get(str(channels)) if isinstance(
                document, dict) else None
            if entry is not None:
                if len(entry["mean"]) != channels or len(entry["std"]) != channels:
                    raise DataError(f"{path}: {STATS_KEY}.{channels} does not hold {channels} "
                                    "means and deviations")
                return PixelStats(path, tuple(entry["mean"]), tuple(entry["std"]))
    return None


def preprocessing_for(config: DataSettings) -> Preprocessing:
    """:func:`resolve_preprocessing` with the statistics found beside ``--data_dir``."""
    return resolve_preprocessing(config, find_pixel_stats(config.data_dir, config.input_channels))
