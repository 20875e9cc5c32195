"""What evaluation does to a raw input, for a model exported to take raw images.

A dataset that reads real images or samples says how its validation split turns one into the
model's input by naming, on its registry entry, ``inference="module:function"``: a function
``DataSettings -> Inference``. The trainer puts that preprocessing in front of the trained model
when it exports it (:mod:`tfscale.training.export`), so ``python -m tfscale.predict`` and users'
``tf.saved_model.load`` give raw pixels and get the predictions evaluation would give.

- :func:`images` (``imagenet``, ``lmdb``): uint8 images of any size, the evaluation crop,
  resize and normalization of :mod:`input_pipelines.core.image_preprocessing`; class names
  from the converter's ``manifest.json`` when there is one.
- :func:`image_folders` (``image_folder``): the same, with the class folders' names.
- :func:`samples` (segmentation): float samples at least ``--image_size`` a side, the
  evaluation's central ``--image_size`` crop and ``stats.json`` normalization.

Datasets that generate their data (``synthetic``) name none: there is no raw image to start
from, and no export.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable

import tensorflow as tf

from input_pipelines.core.class_folders import class_names, split_folder
from input_pipelines.core.image_preprocessing import eval_pixels, per_channel_affine
from input_pipelines.core.manifest import beside
from input_pipelines.core.preprocessing_choice import preprocessing_for
from input_pipelines.core.segmentation import required_stats, stats_affine
from tfscale.config.settings import DataSettings  # noqa: TC001
from tfscale.config.tasks import CLASSIFICATION, SEGMENTATION


@dataclasses.dataclass(frozen=True)
class Inference:
    """How a raw batch ``[N, H, W, channels]`` of ``dtype`` becomes the model's input."""

    task: str
    dtype: str  # of the raw input: uint8 (images) or float32 (samples)
    channels: int
    image_size: int
    preprocess: Callable[[tf.Tensor], tf.Tensor]
    classes: list[str] | None  # names by class index, when the data records them
    classes_from: str  # where the names came from ("" without names)
    description: str  # the preprocessing, in words


def manifest_classes(data_dir: str) -> tuple[list[str] | None, str]:
    """The class names of the converter's manifest beside ``data_dir`` (in its folder or the
    one above) and the manifest's path, or ``(None, "")``."""
    found = beside(data_dir)
    if found is None or not found[1].get("classes"):
        return None, ""
    path, document = found
    return [str(n) for n in document["classes"]], path


def _images(config: DataSettings, classes: list[str] | None, where: str) -> Inference:
    preprocessing = preprocessing_for(config)
    size = config.image_size

    def preprocess(raw: tf.Tensor) -> tf.Tensor:
        return eval_pixels(raw, size, preprocessing)

    description = (f"central crop of {preprocessing.eval_crop_fraction:g} of the shorter "
                   f"side, bilinear resize to {size}x{size}, (pixel - mean) / std with mean "
                   f"[{', '.join(f'{m:.2f}' for m in preprocessing.mean)}] and std "
                   f"[{', '.join(f'{s:.2f}' for s in preprocessing.std)}] "
                   f"(normalization={preprocessing.normalization})")
    return Inference(CLASSIFICATION, "uint8", config.input_channels, size, preprocess,
                     classes, where, description)


def images(config: DataSettings) -> Inference:
    """Classification of encoded images (see the module docstring)."""
    return _images(config, *manifest_classes(config.data_dir))


def image_folders(config: DataSettings) -> Inference:
    """Classification of an image folder: class names are its class folders' names."""
    folder = split_folder(config.data_dir, "train")
    return _images(config, class_names(folder), folder)


def samples(config: DataSettings) -> Inference:
    """Segmentation samples (see the module docstring)."""
    folder, stats = required_stats(config)
    size = config.image_size
    scale, offset = stats_affine(stats)

    def preprocess(raw: tf.Tensor) -> tf.Tensor:
        shape = tf.shape(raw)
        top, left = (shape[1] - size) // 2, (shape[2] - size) // 2
        crop = tf.ensure_shape(raw[:, top:top + size, left:left + size, :],
                               [None, size, size, config.input_channels])
        return per_channel_affine(tf.cast(crop, tf.float32), scale, offset)

    description = (f"central {size}x{size} crop, (value - mean) / std per channel with "
                   f"{os.path.join(folder, 'stats.json')}'s statistics")
    return Inference(SEGMENTATION, "float32", config.input_channels, size, preprocess, None, "",
                     description)
