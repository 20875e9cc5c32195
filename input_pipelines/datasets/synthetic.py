"""Synthetic classification data, for tuning compute without I/O.

A few distinct batches are generated once, on the device that will consume them, and the
dataset cycles through them: no host-side generation or host-to-device copy per step (the
Summit practice of measuring compute alone before adding the input pipeline). Cycling several
batches rather than repeating one keeps the data order meaningful, so a resumed run must
restore its position in the data to match an uninterrupted one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from input_pipelines.registry import Batches, Shard
from tfscale.config.options import Option
from tfscale.config.settings import DataSettings

if TYPE_CHECKING:
    import tensorflow as tf

MAX_BYTES = 256 * 1024 * 1024

# Declared here, read by the registry without TensorFlow (this module imports it lazily).
SYNTHETIC_BATCHES = Option(
    "synthetic_batches", 4, "synthetic: distinct batches generated per worker and cycled "
    "through (fewer when they would exceed 256 MiB).", minimum=1, changes_training=True)
OPTIONS = (SYNTHETIC_BATCHES,)


def synthetic_batches(
    batch_size: int, image_size: int, channels: int, num_classes: int, seed: int,
    most: int = 4,
) -> tuple[tf.Tensor, tf.Tensor]:
    """Up to ``most`` deterministic random batches (at most 256 MiB of images), stacked:
    float32 images in [0, 1) ``[K, B, H, W, C]`` and int32 labels ``[K, B]``."""
    import tensorflow as tf

    batch_bytes = 4 * batch_size * image_size * image_size * channels
    count = max(1, min(most, MAX_BYTES // batch_bytes))
    images = tf.random.stateless_uniform(
        [count, batch_size, image_size, image_size, channels], seed=[seed, 0], dtype=tf.float32
    )
    labels = tf.random.stateless_uniform(
        [count, batch_size], seed=[seed, 1], maxval=num_classes, dtype=tf.int32
    )
    return images, labels


def build(cfg: DataSettings, shard: Shard, split: str, batch_size: int) -> Batches:
    import tensorflow as tf

    # Each worker gets its own data (different seed), as with real sharded data.
    batches = synthetic_batches(
        batch_size, cfg.image_size, cfg.input_channels, cfg.num_classes,
        seed=cfg.seed * 1000 + shard.index + (500 if split == "validation" else 0),
        most=SYNTHETIC_BATCHES.of(cfg),
    )
    dataset = tf.data.Dataset.from_tensor_slices(batches).repeat()
    # Nothing here to tune, and TensorFlow 2.21's tuner costs time: an iterator with autotuning
    # on is freed only at the tuner's next wake-up, which comes at doubling intervals (up to
    # 60 s). Keras' fit() then returned up to 10 s after its last step of a 10-s run (2 runs of
    # 3, plain Keras as well; none with autotuning off).
    options = tf.data.Options()
    options.autotune.enabled = False
    return Batches(dataset.with_options(options), examples=None)
