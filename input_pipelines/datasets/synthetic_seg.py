"""The ``synthetic_seg`` pipeline: climate-like segmentation samples generated on the fly.

Samples come from :mod:`input_pipelines.core.synthetic_fields` (multi-channel fields, a dominant
background class and rare, small, spatially coherent objects), as a pure function of the run's
seed, the worker, the split and the sample's index, so no files are read and each worker reads
its own samples. The training split is endless; the validation split is a fixed set of
``batch_size x max(1, validation_steps)`` samples, read once per evaluation (the registry's
contract), so every evaluation sees the same samples. ``--image_size``, ``--input_channels``
and ``--num_classes`` shape the samples.
"""

from __future__ import annotations

import tensorflow as tf

from input_pipelines.core.synthetic_fields import samples, split_seed
from input_pipelines.registry import Batches, Shard
from tfscale.config.settings import DataSettings


def build(cfg: DataSettings, shard: Shard, split: str, batch_size: int) -> Batches:
    base = split_seed(cfg.seed, shard.index, split)
    size, channels, classes = cfg.image_size, cfg.input_channels, cfg.num_classes
    if split == "train":
        dataset, examples = samples(base, size, size, channels, classes), None
    else:
        examples = batch_size * max(1, cfg.validation_steps)
        dataset = samples(base, size, size, channels, classes, examples).cache()
    dataset = dataset.batch(batch_size, drop_remainder=split == "train")
    return Batches(dataset.prefetch(cfg.prefetch or tf.data.AUTOTUNE), examples)
