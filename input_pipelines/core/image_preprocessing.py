"""Image decoding and augmentation for classification.

What a run gets is a :class:`~input_pipelines.core.preprocessing_choice.Preprocessing` (the
``--augment``, ``--horizontal_flip``, ``--eval_crop_fraction`` and ``--normalization`` flags
resolved). Training, by augment mode:

- ``imagenet``: a random-resized crop (random area 8-100%, aspect ratio 3/4-4/3) chosen from the
  image's header and fused with JPEG decoding (only the crop is decoded), resized;
- ``small``: the whole image resized, padded with black by ``image_size // 8`` on each side, and
  a random ``image_size`` crop of that (shifts of up to 1/8 of the side, the CIFAR recipe);
- ``flip`` and ``none``: the whole image resized;

then a random horizontal flip when ``flip`` is on. Evaluation: a central square crop covering
``eval_crop_fraction`` of the shorter side (fused with JPEG decoding), resized. Both end with
per-channel ``(pixel - mean) / std``. Randomness is stateless: the caller passes each image's
seed, so the augmentation of an element is a function of its position in the stream. Images in
other formats (PNG, GIF, BMP) take the same path after a full decode.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from input_pipelines.core import report
from input_pipelines.core.checks import checked_labels, non_finite
from input_pipelines.core.preprocessing_choice import Preprocessing, preprocessing_for
from input_pipelines.registry import Shard
from tfscale.config.settings import DataSettings

AREA_RANGE = (0.08, 1.0)
ASPECT_RANGE = (3 / 4, 4 / 3)
PAD_DIVISOR = 8  # augment=small pads by image_size // 8 on each side

Window = Callable[[tf.Tensor], tf.Tensor]  # image shape [h, w, c] -> crop window [y, x, h, w]


def _decode_window(encoded: tf.Tensor, window: Window, channels: int) -> tf.Tensor:
    """Decodes the crop ``window(shape)`` of an encoded image (only that part for JPEG)."""

    def jpeg() -> tf.Tensor:
        crop = window(tf.image.extract_jpeg_shape(encoded))
        return tf.image.decode_and_crop_jpeg(encoded, crop, channels=channels)

    def other() -> tf.Tensor:
        image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
        crop = window(tf.shape(image))
        return tf.slice(image, [crop[0], crop[1], 0], [crop[2], crop[3], channels])

    return tf.cond(tf.io.is_jpeg(encoded), jpeg, other)


def per_channel_affine(image: tf.Tensor, scale: Sequence[float],
                       offset: Sequence[float]) -> tf.Tensor:
    """``image * scale + offset`` per channel, for images ``[..., H, W, C]`` of static width.

    The per-channel vectors are tiled to a ``[1, W, C]`` row first: TensorFlow's CPU kernels
    broadcast a row over the height about 4x faster than a ``[C]`` vector over every pixel,
    which made normalization the costliest step of ImageNet preprocessing.
    """
    width = image.shape[-2]
    row = np.ones((1, width, 1), np.float32)
    return (tf.cast(image, tf.float32) * tf.constant(row * np.asarray(scale, np.float32))
            + tf.constant(row * np.asarray(offset, np.float32)))


def normalize(image: tf.Tensor, preprocessing: Preprocessing) -> tf.Tensor:
    """Pixels in [0, 255] -> float32 ``(pixel - mean) / std`` per channel, with the mean and
    deviation of ``preprocessing`` (``image`` must have a static width)."""
    mean, std = preprocessing.mean, preprocessing.std
    return per_channel_affine(image, [1 / s for s in std],
                              [-m / s for m, s in zip(mean, std, strict=True)])


def _resize(image: tf.Tensor, image_size: int) -> tf.Tensor:
    return tf.image.resize(image, [image_size, image_size], method="bilinear", antialias=False)


def _random_resized_crop(encoded: tf.Tensor, seed: tf.Tensor, channels: int) -> tf.Tensor:
    def window(shape: tf.Tensor) -> tf.Tensor:
        begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
            shape, bounding_boxes=tf.constant([[[0.0, 0.0, 1.0, 1.0]]]), seed=seed,
            min_object_covered=0.1, aspect_ratio_range=ASPECT_RANGE, area_range=AREA_RANGE,
            max_attempts=10, use_image_if_no_bounding_boxes=True)
        return tf.stack([begin[0], begin[1], size[0], size[1]])

    return _decode_window(encoded, window, channels)


def train_image(encoded: tf.Tensor, seed: tf.Tensor, image_size: int, channels: int,
                preprocessing: Preprocessing) -> tf.Tensor:
    """The augmented training image of ``encoded``, normalized (see the module docstring).

    Args:
        encoded: JPEG (or PNG, GIF, BMP) bytes, a scalar string tensor.
        seed: int64 ``[2]`` stateless seed of this element.
        image_size: output height and width.
        channels: 3 (RGB) or 1 (grayscale).
        preprocessing: the resolved augmentation and normalization.

    Returns:
        float32 ``[image_size, image_size, channels]``.
    """
    crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
    shape = [image_size, image_size, channels]
    if preprocessing.augment == "imagenet":
        image = _random_resized_crop(encoded, crop_seed, channels)
    else:
        image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
    image = tf.ensure_shape(_resize(image, image_size), shape)
    if preprocessing.augment == "small":
        pad = image_size // PAD_DIVISOR
        image = tf.pad(image, [[pad, pad], [pad, pad], [0, 0]])
        image = tf.image.stateless_random_crop(image, shape, crop_seed)
    if preprocessing.flip:
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    return normalize(image, preprocessing)


def central_square(shape: tf.Tensor, fraction: float) -> tf.Tensor:
    """The crop window ``[y, x, h, w]`` of the central square covering ``fraction`` of the
    shorter side of an image of ``shape`` ``[height, width, ...]``."""
    height, width = shape[0], shape[1]
    side = tf.cast(fraction * tf.cast(tf.minimum(height, width), tf.float32), tf.int32)
    side = tf.maximum(side, 1)
    return tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])


def eval_image(encoded: tf.Tensor, image_size: int, channels: int,
               preprocessing: Preprocessing) -> tf.Tensor:
    """Central crop (``preprocessing.eval_crop_fraction`` of the shorter side) of an encoded
    image, resized to ``image_size``, normalized.

    Returns:
        float32 ``[image_size, image_size, channels]``.
    """
    fraction = preprocessing.eval_crop_fraction
    image = _decode_window(encoded, lambda shape: central_square(shape, fraction), channels)
    image = tf.ensure_shape(_resize(image, image_size), [image_size, image_size, channels])
    return normalize(image, preprocessing)


def eval_pixels(images: tf.Tensor, image_size: int, preprocessing: Preprocessing) -> tf.Tensor:
    """What :func:`eval_image` does after decoding, for decoded images ``[N, H, W, C]`` of one
    size (uint8 or float pixels in [0, 255]): the same window, resize and normalization, so an
    exported model given raw pixels sees what evaluation saw (decoding a JPEG window equals
    slicing the decoded image).

    Returns:
        float32 ``[N, image_size, image_size, C]``.
    """
    window = central_square(tf.shape(images)[1:], preprocessing.eval_crop_fraction)
    crop = images[:, window[0]:window[0] + window[2], window[1]:window[1] + window[3], :]
    resized = _resize(crop, image_size)
    resized = tf.ensure_shape(resized, [None, image_size, image_size, images.shape[-1]])
    return normalize(resized, preprocessing)


def validate_channels(channels: int, dataset: str) -> None:
    """Raises ``ValueError`` unless ``channels`` is 1 or 3 (what image decoders produce)."""
    if channels not in (1, 3):
        raise ValueError(f"--input_channels={channels} is not valid for --dataset={dataset}; "
                         "images decode to 1 (grayscale) or 3 (RGB) channels")


_announced: set[Preprocessing] = set()


def announce(preprocessing: Preprocessing) -> None:
    """Prints ``preprocessing`` on stderr, once per process (pipelines are built repeatedly)."""
    if preprocessing not in _announced:
        _announced.add(preprocessing)
        report.note(None, preprocessing.describe())


def run_preprocessing(config: DataSettings, shard: Shard, split: str) -> Preprocessing:
    """The run's resolved preprocessing, announced by the first worker when it builds its
    training pipeline.

    Raises:
        ValueError: see :func:`~input_pipelines.core.preprocessing_choice.resolve_preprocessing`.
    """
    preprocessing = preprocessing_for(config)
    if split == "train" and shard.index == 0:
        announce(preprocessing)
    return preprocessing


def classification_transform(config: DataSettings, split: str, preprocessing: Preprocessing
                             ) -> Callable[[tuple[tf.Tensor, tf.Tensor], tf.Tensor],
                                           tuple[tf.Tensor, tf.Tensor]]:
    """(encoded image, label), seed -> (float32 image, int32 label) for ``split``, at
    ``config.image_size`` with ``config.input_channels`` channels."""
    size, channels, num_classes = config.image_size, config.input_channels, config.num_classes

    def transform(element: tuple[tf.Tensor, tf.Tensor],
                  seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        encoded, label = element
        if split == "train":
            image = train_image(encoded, seed, size, channels, preprocessing)
        else:
            image = eval_image(encoded, size, channels, preprocessing)
        return image, checked_labels(label, num_classes)

    return transform


def decodes(encoded: tf.Tensor, label: tf.Tensor, channels: int) -> tf.Tensor:
    """Decodes the whole image (failing if it cannot) and returns ``[label, label, 0]``, what
    the up-front check (:data:`input_pipelines.core.checks.Check`) expects."""
    image = tf.io.decode_image(encoded, channels=channels, expand_animations=False)
    label = tf.cast(label, tf.int64)
    return tf.stack([label, label, non_finite(image)])
