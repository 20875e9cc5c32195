"""Segmentation from HDF5 files: one sample per file or many, climate-style.

Files are ``.h5``/``.hdf5`` under ``DATA_DIR/train/``, ``DATA_DIR/validation/`` (or
``DATA_DIR/SPLIT-*.h5``, or directly in ``DATA_DIR`` for training only), laid out as in
:mod:`input_pipelines.core.sample_files`. ``DATA_DIR/stats.json`` (``python -m
input_pipelines.tools.stats``) supplies the normalization and the dataset names (``data``/``labels``
unless the tool was given others). Before training each worker opens its files' metadata: a file
that cannot be opened is corrupt (``--skip_corrupt`` skips it), and a file whose samples differ in
shape from the split's first file fails the run naming both.
"""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf

from input_pipelines.core import checks, mechanics
from input_pipelines.core.errors import CorruptFileError, DataError
from input_pipelines.core.sample_files import (
    DATA_KEY,
    H5_SUFFIXES,
    LABEL_KEY,
    Layout,
    check_same_shapes,
    inspect,
    read_sample,
)
from input_pipelines.core.segmentation import (
    check_file_labels,
    check_sample_shape,
    required_stats,
    segmentation_transform,
)
from input_pipelines.core.sources import WorkerFiles, worker_files
from input_pipelines.registry import Batches, Shard
from tfscale.config.settings import DataSettings


def read_sample_refs(path: tf.Tensor, first: tf.Tensor, count: tf.Tensor) -> tf.data.Dataset:
    """A :data:`~input_pipelines.core.mechanics.Reader` yielding (path, index) references; the
    samples themselves are read by the parallel map."""
    return tf.data.Dataset.range(count).map(lambda i: (first + i, (path, i)))


def _check_unlisted_labels(files: WorkerFiles, layouts: dict[str, Layout], keys: tuple[str, str],
                           listed: set[str], num_classes: int) -> None:
    """Reads the labels of small files that stats.json does not list, naming any bad one."""
    if files.bytes > checks.FULL_CHECK_BYTES:
        return
    for path, source in zip(files.paths, files.sources, strict=True):
        if source in listed:
            continue
        for index in range(layouts[path].samples):
            _, labels = read_sample(path, index, layouts[path], *keys)
            error = checks.label_error(f"{source}: sample {index}", int(labels.min()),
                                       int(labels.max()), num_classes)
            if error is not None:
                raise error


def _reference(files: WorkerFiles, layouts: dict[str, Layout], keys: tuple[str, str],
               skip_corrupt: bool) -> tuple[str, Layout]:
    """The split's first file and its layout, which every worker compares its files with (the
    worker's own first file when that one is corrupt and skipped)."""
    try:
        return files.first_source, inspect(files.first_source, *keys)
    except CorruptFileError:
        if not skip_corrupt or not files.paths:
            raise
        return files.sources[0], layouts[files.paths[0]]


def build(config: DataSettings, shard: Shard, split: str, batch_size: int) -> Batches:
    """The ``segmentation_h5`` pipeline of worker ``shard`` (see the module docstring)."""
    root, stats = required_stats(config)
    keys = (str(stats.get("data_key", DATA_KEY)), str(stats.get("label_key", LABEL_KEY)))
    check_sample_shape(stats["sample_shape"], os.path.join(root, "stats.json"), config)
    layouts: dict[str, Layout] = {}

    def count(path: str) -> int:
        layouts[path] = inspect(path, *keys)
        return layouts[path].samples

    files = worker_files(config, shard, split, count, H5_SUFFIXES)
    first, reference = _reference(files, layouts, keys, config.skip_corrupt)
    for path, source in zip(files.paths, files.sources, strict=True):
        check_same_shapes(first, reference, source, layouts[path])
    if tuple(reference.sample_shape) != tuple(stats["sample_shape"]):
        raise DataError(f"{first}: samples have shape {reference.sample_shape} but "
                        f"{root}/stats.json was computed for {tuple(stats['sample_shape'])}; "
                        "recompute it with python -m input_pipelines.tools.stats")
    check_file_labels(stats, root, files.sources, config.num_classes)
    listed = {os.path.join(root, f) for f in stats.get("files", {})}
    _check_unlisted_labels(files, layouts, keys, listed, config.num_classes)
    sample_shape, label_shape = reference.sample_shape, reference.label_shape

    def load(path: bytes, index: np.int64) -> tuple[np.ndarray, np.ndarray]:
        name = path.decode()
        return read_sample(name, int(index), layouts[name], *keys)

    def parse(ref: tuple[tf.Tensor, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
        data, labels = tf.numpy_function(load, list(ref), (tf.float32, tf.int32), stateful=False)
        return tf.ensure_shape(data, sample_shape), tf.ensure_shape(labels, label_shape)

    return mechanics.batches(files.paths, files.counts, read_sample_refs, parse,
                             segmentation_transform(stats, config, split),
                             files.reading(config), shard, split,
                             batch_size)
