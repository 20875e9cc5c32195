"""Segmentation from TFRecord shards.

As ``python -m input_pipelines.tools.segmentation_to_tfrecord`` writes them (schema in
:mod:`input_pipelines.core.segmentation_records`).

Shards are ``DATA_DIR/train-*`` and ``DATA_DIR/validation-*`` with ``manifest.json`` and
``stats.json`` beside them. The checks before training are those of every TFRecord pipeline
(framing scan, manifest counts and label ranges, a full read of small data).
"""

from __future__ import annotations

import os

import tensorflow as tf

from input_pipelines.core import checks, mechanics, segmentation_records
from input_pipelines.core.segmentation import (
    check_file_labels,
    check_sample_shape,
    required_stats,
    segmentation_transform,
)
from input_pipelines.core.sources import check_manifest_labels, worker_files
from input_pipelines.core.tfrecord_scan import scan_tfrecord
from input_pipelines.registry import Batches, Shard
from tfscale.config.settings import DataSettings


def build(config: DataSettings, shard: Shard, split: str, batch_size: int) -> Batches:
    """The ``segmentation_tfrecord`` pipeline of worker ``shard`` (see the module docstring)."""
    root, stats = required_stats(config)
    sample_shape = tuple(int(d) for d in stats["sample_shape"])
    check_sample_shape(sample_shape, os.path.join(root, "stats.json"), config)
    files = worker_files(config, shard, split, scan_tfrecord)
    check_manifest_labels(files, config.num_classes)
    check_file_labels(stats, root, files.sources, config.num_classes)

    def parse(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return segmentation_records.parse(record, sample_shape)

    def label_range(record: tf.Tensor) -> tf.Tensor:
        data, labels = parse(record)
        labels = tf.cast(labels, tf.int64)
        return tf.stack([tf.reduce_min(labels), tf.reduce_max(labels), checks.non_finite(data)])

    if files.bytes <= checks.FULL_CHECK_BYTES:
        corrupt = checks.check_tfrecords(files.paths, files.sources, label_range,
                                         config.num_classes, "sample")
        files = files.without(corrupt, config, shard, split)
    return mechanics.batches(files.paths, files.counts, mechanics.read_tfrecords, parse,
                             segmentation_transform(stats, config, split),
                             files.reading(config), shard, split,
                             batch_size)
