"""What the segmentation pipelines share: statistics, checks before training, the transform.

Both read ``stats.json`` beside the data (:mod:`input_pipelines.core.stats`), check the sample shape
against ``--input_channels`` and ``--image_size`` and each file's recorded label range against
``--num_classes``, and turn a sample into ``(normalized float32 H x W x C, int32 H x W)``.
Samples larger than ``--image_size`` are cropped to it: at random when training (the same window
for data and labels), centrally for validation.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf

from input_pipelines.core.checks import checked_labels, label_error
from input_pipelines.core.errors import DataError
from input_pipelines.core.files import data_root, is_glob
from input_pipelines.core.image_preprocessing import per_channel_affine
from input_pipelines.core.stats import STATS, load_stats
from tfscale.config.settings import DataSettings


def required_stats(config: DataSettings) -> tuple[str, dict[str, Any]]:
    """The folder and contents of the stats.json of ``--data_dir`` (in its folder, or the one
    above for a ``SPLIT/`` folder or a glob inside one).

    Raises:
        DataError: it is missing (saying how to compute it).
    """
    root = data_root(config.data_dir)
    if not os.path.exists(root if is_glob(config.data_dir) else config.data_dir):
        raise DataError(f"--data_dir={config.data_dir} does not exist")
    for folder in (root, os.path.dirname(os.path.abspath(root))):
        stats = load_stats(folder)
        if stats is not None:
            return folder, stats
    raise DataError(f"no {STATS} in {root}: compute the normalization statistics first "
                    f"with: python -m input_pipelines.tools.stats --data_dir {root}")


def check_sample_shape(shape: Sequence[int], where: str, config: DataSettings) -> None:
    """Raises ``DataError`` unless samples of ``shape`` (H, W, C) fit the configuration."""
    height, width, channels = shape
    if channels != config.input_channels:
        raise DataError(f"{where}: samples have {channels} channels but "
                        f"--input_channels={config.input_channels}")
    if min(height, width) < config.image_size:
        raise DataError(f"{where}: samples are {height}x{width}, smaller than "
                        f"--image_size={config.image_size}")


def check_file_labels(stats: dict[str, Any], root: str, sources: Sequence[str],
                      num_classes: int) -> None:
    """Checks the label range stats.json (in folder ``root``) records for each of ``sources``.

    Raises:
        DataError: naming the first file with a label outside ``[0, num_classes)``.
    """
    files = stats.get("files", {})
    for source in sources:
        entry = files.get(os.path.relpath(source, root))
        if entry is not None and entry["samples"]:
            error = label_error(source, entry["label_min"], entry["label_max"], num_classes)
            if error is not None:
                raise error


def _crop(data: tf.Tensor, labels: tf.Tensor, top: tf.Tensor, left: tf.Tensor,
          size: int) -> tuple[tf.Tensor, tf.Tensor]:
    return (data[top:top + size, left:left + size, :], labels[top:top + size, left:left + size])


def stats_affine(stats: dict[str, Any]) -> tuple[list[float], list[float]]:
    """The per-channel scale and offset that make ``(value - mean) / std`` with the
    statistics of ``stats.json``."""
    scale = [1 / s for s in stats["std"]]
    return scale, [-m / s for m, s in zip(stats["mean"], stats["std"], strict=True)]


def segmentation_transform(stats: dict[str, Any], config: DataSettings, split: str
                           ) -> Callable[[tuple[tf.Tensor, tf.Tensor], tf.Tensor],
                                         tuple[tf.Tensor, tf.Tensor]]:
    """(data, labels), seed -> (normalized cropped data, checked labels) for ``split``."""
    height, width, channels = stats["sample_shape"]
    size = config.image_size
    scale, offset = stats_affine(stats)

    def transform(sample: tuple[tf.Tensor, tf.Tensor],
                  seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        data, labels = sample
        if split == "train":
            top_seed, left_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
            top = tf.random.stateless_uniform([], top_seed, 0, height - size + 1, tf.int32)
            left = tf.random.stateless_uniform([], left_seed, 0, width - size + 1, tf.int32)
        else:
            top, left = tf.constant((height - size) // 2), tf.constant((width - size) // 2)
        data, labels = _crop(data, labels, top, left, size)
        data = per_channel_affine(tf.ensure_shape(data, [size, size, channels]), scale, offset)
        labels = tf.ensure_shape(checked_labels(labels, config.num_classes), [size, size])
        return data, labels

    return transform
