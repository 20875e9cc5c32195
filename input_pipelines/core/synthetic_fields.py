"""Synthetic climate-like segmentation samples, and writing them to HDF5 files.

Each sample is ``H x W x C`` float32 fields and ``H x W`` int32 labels. Class 0 is the
background; every other class is a rare kind of object drawn as up to :data:`MAX_BLOBS`
ellipses (each present with probability 1/2): odd classes round and small, like tropical
cyclones, even classes long and thin at a random angle, like atmospheric rivers. Each rare class
covers about 2% of the pixels (1-3% over many samples). The fields are spatially smooth noise
plus, for each rare class, a fixed per-class signature across the channels weighted by a soft
bump that is 1 at an object's centre and ``exp(-1/2)`` on its boundary, plus white noise: the
channels carry the labels, blurred at the edges. The signatures are faint (:data:`SIGNAL`), so
that, as with the climate data, a network trained briefly with the unweighted loss predicts
little but background, while class weights make it find the objects (docs/SEGMENTATION.md).

A sample is a pure function of ``(seed, worker, split, index)`` (stateless random ops), so data
are reproducible, each worker (``shard.index``) and split gets its own samples, and the signature
of each class is the same for all of them. The ``synthetic_seg`` pipeline
(:mod:`input_pipelines.datasets.synthetic_seg`) generates samples on the fly;
``python -m input_pipelines.tools.synthetic_h5 --out DIR`` writes the same samples (worker 0) to
HDF5 files for the file-based pipelines (``segmentation_h5``).
"""

from __future__ import annotations

import math
import os

import h5py
import numpy as np
import tensorflow as tf

from input_pipelines.registry import SPLITS

MAX_BLOBS = 3
SIGNAL = 0.5  # RMS over the channels of a class signature; the noise RMS is about 1
WHITE_NOISE = 0.5
SMOOTH_CELL = 8  # pixels per cell of the smooth noise grid
SIGNATURE_SEED = 20170  # fixed: the "physics" linking fields and labels is shared by all seeds


def split_seed(seed: int, worker: int, split: str) -> int:
    """The base seed of ``split`` on ``worker`` for a run seeded with ``seed``."""
    if split not in SPLITS:
        raise ValueError(f"split {split!r}; expected one of {SPLITS}")
    state = np.random.SeedSequence([seed, worker, SPLITS.index(split)]).generate_state(1)
    return int(state[0])


def signatures(num_classes: int, channels: int, signal: float = SIGNAL) -> np.ndarray:
    """``[num_classes, channels]`` per-class field signatures (row 0, background, is zero)."""
    rng = np.random.default_rng(SIGNATURE_SEED)
    rows = rng.standard_normal((num_classes, channels))
    rows /= np.sqrt(np.mean(rows**2, axis=1, keepdims=True))
    rows[0] = 0.0
    return (signal * rows).astype(np.float32)


def _fold(seed: tf.Tensor, part: int) -> tf.Tensor:
    """An independent seed for one random part of a sample."""
    return tf.random.experimental.stateless_fold_in(seed, part)


def _blobs(seed: tf.Tensor, height: int, width: int, round_: bool) -> tuple[tf.Tensor, tf.Tensor]:
    """One rare class's objects: a boolean mask and a soft bump, both ``[H, W]``."""
    size = float(min(height, width))

    def uniform(part: int, low: float, high: float) -> tf.Tensor:
        return tf.random.stateless_uniform([MAX_BLOBS], _fold(seed, part), low, high)

    centre_y = uniform(0, 0.0, float(height))[:, None, None]
    centre_x = uniform(1, 0.0, float(width))[:, None, None]
    if round_:
        major, aspect = uniform(2, 0.05, 0.10) * size, uniform(3, 0.5, 1.0)
    else:
        major, aspect = uniform(2, 0.08, 0.16) * size, uniform(3, 0.2, 0.4)
    minor = tf.maximum(major * aspect, 1.0)
    angle = uniform(4, 0.0, math.pi)[:, None, None]
    present = uniform(5, 0.0, 1.0) < 0.5
    dy = tf.range(height, dtype=tf.float32)[None, :, None] + 0.5 - centre_y
    dx = tf.range(width, dtype=tf.float32)[None, None, :] + 0.5 - centre_x
    along = dx * tf.cos(angle) + dy * tf.sin(angle)
    across = dy * tf.cos(angle) - dx * tf.sin(angle)
    distance2 = (along / major[:, None, None]) ** 2 + (across / minor[:, None, None]) ** 2
    present = present[:, None, None]
    mask = tf.reduce_any(present & (distance2 < 1.0), axis=0)
    soft = tf.reduce_max(tf.where(present, tf.exp(-0.5 * distance2), 0.0), axis=0)
    return mask, soft


def generate_sample(
    seed: tf.Tensor,
    height: int,
    width: int,
    channels: int,
    num_classes: int,
    signal: float = SIGNAL,
) -> tuple[tf.Tensor, tf.Tensor]:
    """One sample: float32 fields ``[H, W, C]`` and int32 labels ``[H, W]``.

    Args:
        seed: int64 ``[2]`` stateless seed of the sample (see :func:`sample_seed`).
        height: rows.
        width: columns.
        channels: fields per pixel (C).
        num_classes: classes including the background class 0.
        signal: RMS over the channels of each class signature (the noise's is about 1).
    """
    grid = [math.ceil(height / SMOOTH_CELL) + 1, math.ceil(width / SMOOTH_CELL) + 1, channels]
    coarse = tf.random.stateless_normal(grid, _fold(seed, 0))
    fields = tf.image.resize(coarse, [height, width], method="bicubic")
    fields += WHITE_NOISE * tf.random.stateless_normal([height, width, channels], _fold(seed, 1))
    labels = tf.zeros([height, width], tf.int32)
    rows = tf.constant(signatures(num_classes, channels, signal))
    for cls in range(1, num_classes):
        mask, soft = _blobs(_fold(seed, 1 + cls), height, width, round_=cls % 2 == 1)
        labels = tf.where(mask, cls, labels)
        fields += soft[:, :, None] * rows[cls]
    return fields, labels


def sample_seed(base: int, index: tf.Tensor) -> tf.Tensor:
    """The stateless seed of sample ``index`` of the stream with base seed ``base``."""
    return tf.stack([tf.constant(base, tf.int64), tf.cast(index, tf.int64)])


def samples(
    base: int,
    height: int,
    width: int,
    channels: int,
    num_classes: int,
    count: int | None = None,
    signal: float = SIGNAL,
) -> tf.data.Dataset:
    """The unbatched samples 0, 1, ... (``count`` of them, or endless) of stream ``base``."""
    indices = tf.data.Dataset.range(count) if count is not None else tf.data.Dataset.counter()
    return indices.map(
        lambda i: generate_sample(
            sample_seed(base, i), height, width, channels, num_classes, signal
        ),
        num_parallel_calls=tf.data.AUTOTUNE,
        deterministic=True,
    )


def write_h5(
    directory: str,
    count: int,
    per_file: int,
    height: int,
    width: int,
    channels: int,
    num_classes: int,
    seed: int = 0,
    split: str = "train",
) -> list[str]:
    """Writes ``count`` samples of worker 0's ``split`` stream to HDF5 files in ``directory``.

    With ``per_file == 1`` each file holds ``data`` (H x W x C float32) and ``labels`` (H x W
    int32); otherwise each holds up to ``per_file`` samples with a leading sample axis.

    Returns:
        The paths written, in sample order.

    Raises:
        ValueError: for a non-positive ``count`` or ``per_file``.
    """
    if count < 1 or per_file < 1:
        raise ValueError(f"count={count}, per_file={per_file}; both must be >= 1")
    os.makedirs(directory, exist_ok=True)
    stream = samples(split_seed(seed, 0, split), height, width, channels, num_classes, count)
    paths = []
    for number, (data, labels) in enumerate(stream.batch(per_file).as_numpy_iterator()):
        path = os.path.join(directory, f"{split}-{number:05d}.h5")
        if per_file == 1:
            data, labels = data[0], labels[0]
        with h5py.File(path, "w") as handle:
            handle.create_dataset("data", data=data.astype(np.float32))
            handle.create_dataset("labels", data=labels.astype(np.int32))
        paths.append(path)
    return paths
