"""Synthetic classification data, for tuning compute without I/O.

One batch is generated once, on the device that will consume it, and the dataset repeats it:
no host-side generation or host-to-device copy per step (the Summit practice of measuring
compute alone before adding the input pipeline).
"""

from __future__ import annotations

import tensorflow as tf

from input_pipelines.registry import Batches, Shard, register
from tfscale.config import TrainConfig


def synthetic_batch(
    batch_size: int, image_size: int, channels: int, num_classes: int, seed: int
) -> tuple[tf.Tensor, tf.Tensor]:
    """A deterministic random batch: float32 images in [0, 1) and int32 labels."""
    images = tf.random.stateless_uniform(
        [batch_size, image_size, image_size, channels], seed=[seed, 0], dtype=tf.float32
    )
    labels = tf.random.stateless_uniform(
        [batch_size], seed=[seed, 1], maxval=num_classes, dtype=tf.int32
    )
    return images, labels


@register("synthetic", "random images and labels generated once on the device",
          task="classification")
def build(cfg: TrainConfig, shard: Shard, split: str, batch_size: int) -> Batches:
    # Each worker gets its own data (different seed), as with real sharded data.
    batch = synthetic_batch(
        batch_size, cfg.image_size, cfg.input_channels, cfg.num_classes,
        seed=cfg.seed * 1000 + shard.index + (500 if split == "validation" else 0),
    )
    return Batches(tf.data.Dataset.from_tensors(batch).repeat(), examples=None)
