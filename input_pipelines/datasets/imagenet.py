"""ImageNet-style classification from TFRecord shards.

Each record is a ``tf.train.Example`` with ``image/encoded`` (JPEG bytes; PNG also decodes) and
``image/class/label`` (int64 in ``[0, num_classes)``); ``image/height``/``image/width`` may be
present and are not needed. Shards are ``DATA_DIR/train-*`` and ``DATA_DIR/validation-*``, as
``python -m input_pipelines.tools.folder_to_tfrecord`` writes them (with a ``manifest.json``).
Training augments as ``--augment`` says (the ImageNet random-resized crop, fused with JPEG
decoding, for large images; pad-and-crop for small ones), evaluation takes a central crop; both
resize to ``--image_size`` and normalize, with the manifest's pixel statistics when it has them
(see :mod:`input_pipelines.core.preprocessing_choice` and
:mod:`input_pipelines.core.image_preprocessing`).
"""

from __future__ import annotations

import tensorflow as tf

from input_pipelines.core import checks, mechanics
from input_pipelines.core.image_preprocessing import (
    classification_transform,
    decodes,
    run_preprocessing,
    validate_channels,
)
from input_pipelines.core.sources import WorkerFiles, check_manifest_labels, worker_files
from input_pipelines.core.tfrecord_scan import scan_tfrecord
from input_pipelines.registry import Batches, Shard
from tfscale.config.settings import DataSettings

FEATURES = {
    "image/encoded": tf.io.FixedLenFeature([], tf.string),
    "image/class/label": tf.io.FixedLenFeature([], tf.int64),
}


def parse(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """A serialized example -> (encoded image bytes, int64 label)."""
    features = tf.io.parse_single_example(record, FEATURES)
    return features["image/encoded"], features["image/class/label"]


def check_small(files: WorkerFiles, config: DataSettings, shard: Shard,
                split: str) -> WorkerFiles:
    """Reads every record of small data up front (see :mod:`input_pipelines.core.checks`).

    Returns:
        ``files`` less the corrupt ones (with ``--skip_corrupt``).

    Raises:
        DataError: an image does not decode, a label is out of range, or a file is corrupt
            (without ``--skip_corrupt``).
    """
    if files.bytes > checks.FULL_CHECK_BYTES:
        return files
    channels = config.input_channels
    corrupt = checks.check_tfrecords(
        files.paths, files.sources, lambda r: decodes(*parse(r), channels=channels),
        config.num_classes, "image")
    return files.without(corrupt, config, shard, split)


def build(config: DataSettings, shard: Shard, split: str, batch_size: int) -> Batches:
    """The ``imagenet`` pipeline of worker ``shard`` (see the module docstring)."""
    validate_channels(config.input_channels, "imagenet")
    files = worker_files(config, shard, split, scan_tfrecord)
    check_manifest_labels(files, config.num_classes)
    files = check_small(files, config, shard, split)
    transform = classification_transform(config, split,
                                         run_preprocessing(config, shard, split))
    return mechanics.batches(files.paths, files.counts, mechanics.read_tfrecords, parse,
                             transform, files.reading(config), shard, split, batch_size)
