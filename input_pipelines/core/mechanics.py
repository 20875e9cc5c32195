"""The tf.data mechanics every file-based pipeline shares.

:func:`batches` turns a worker's files into the batched dataset of the registry's contract:

    training: for epoch 0, 1, 2, ... (forever); validation: once
        files (training: shuffled with a seed made of config.seed and the epoch)
          -> parallel interleave across files (each yields (global record index, record))
          -> [record-level sharding: keep every count-th record]
          -> parallel map: parse (cheap; with config.cache, cached after the first epoch)
          -> [training: shuffle buffer, seeded by config.seed and the epoch]
      -> parallel map: transform (decode, augment; per-element stateless seeds)
      -> batch (training: drop_remainder=True; validation: the last batch partial)
      -> prefetch (AUTOTUNE, or a fixed buffer of ``config.prefetch`` batches to cap memory)

With ``config.deterministic`` the order of elements is fixed and every random choice (file
order, shuffle buffer, augmentation) follows from ``config.seed`` and the position in the
stream, so epoch ``e`` sees the same data in every run, every iterator of the dataset yields the
same stream, and ``dataset.skip(n)`` resumes exactly. Without it, parallel stages may hand out
elements as they finish, which is faster. Validation data is read once per iterator, in file
order, unshuffled and whole, so an evaluation sees each of the worker's examples exactly once
(:mod:`tfscale.training.evaluation`); a worker without validation examples gets an empty dataset.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from itertools import accumulate
from typing import Any

import tensorflow as tf

from input_pipelines.core.errors import DataError
from input_pipelines.registry import Batches, Shard
from tfscale.config.settings import DataSettings

# (path, index of the file's first record in the split, records in the file)
#   -> dataset of (global record index int64, record)
Reader = Callable[[tf.Tensor, tf.Tensor, tf.Tensor], tf.data.Dataset]
Parse = Callable[[Any], Any]
# (parsed element, stateless seed int64[2]) -> (image, label)
Transform = Callable[[Any, tf.Tensor], tuple[tf.Tensor, tf.Tensor]]

MAX_CYCLE = 16  # files read at once by the interleave
READ_BUFFER = 2**20  # bytes of read-ahead per open TFRecord file


def read_tfrecords(path: tf.Tensor, first: tf.Tensor, count: tf.Tensor) -> tf.data.Dataset:
    """A :data:`Reader` for TFRecord files."""
    del count  # known from the file itself
    return tf.data.TFRecordDataset(path, buffer_size=READ_BUFFER).enumerate(first)


def records_of_shard(total: int, shard: Shard) -> int:
    """How many of ``total`` records have an index ``i`` with ``i % count == index``."""
    return max(0, -(-(total - shard.index) // shard.count))


def _seed(seed: int, epoch: tf.Tensor, stage: int) -> tf.Tensor:
    """The shuffle seed of ``stage`` (0 files, 1 records) in ``epoch``."""
    return (tf.constant(seed, tf.int64) * 1_000_003 + epoch) * 2 + stage


def options(config: DataSettings) -> tf.data.Options:
    """Options shared by every pipeline: determinism, autotuning, no automatic re-sharding."""
    opts = tf.data.Options()
    opts.deterministic = config.deterministic
    opts.autotune.enabled = True
    # The pipelines shard themselves; tf.distribute must not shard again.
    opts.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return opts


def batches(files: Sequence[str], counts: Sequence[int], read: Reader, parse: Parse,
            transform: Transform, config: DataSettings, shard: Shard, split: str,
            batch_size: int) -> Batches:
    """The batched dataset of this worker's ``files`` (see the module docstring).

    Args:
        files: the files this worker reads: its own under file-level sharding, every file of
            the split (in the order shared by all workers) under ``config.record_sharding``.
        counts: records per file.
        read: opens one file (see :data:`Reader`).
        parse: record -> element; cheap and deterministic (its output is what gets cached).
        transform: (element, seed) -> (image, label); random only when training.
        config: the run's configuration.
        shard: this worker.
        split: ``"train"`` (shuffled, augmented) or ``"validation"``.
        batch_size: this process's batch.

    Raises:
        DataError: the files hold no training examples for this worker.
    """
    total = sum(counts)
    sharded = config.record_sharding and shard.count > 1
    examples = records_of_shard(total, shard) if sharded else total
    training = split == "train"
    if examples == 0 and training:
        where = files[0] if files else config.data_dir
        raise DataError(f"no {split} examples for this worker in {len(files)} file(s) "
                        f"(first: {where})")
    deterministic = config.deterministic
    firsts = [0, *accumulate(counts)][:-1]
    file_table = (list(files), tf.constant(firsts, tf.int64), tf.constant(list(counts), tf.int64))

    def records(epoch: tf.Tensor | None) -> tf.data.Dataset:
        ds = tf.data.Dataset.from_tensor_slices(file_table)
        if epoch is not None:
            ds = ds.shuffle(len(files), seed=_seed(config.seed, epoch, 0))
        ds = ds.interleave(read, cycle_length=min(len(files), MAX_CYCLE), block_length=1,
                           num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
        if sharded:
            ds = ds.filter(lambda index, _: index % shard.count == shard.index)
        return ds.map(lambda _, record: parse(record), num_parallel_calls=tf.data.AUTOTUNE,
                      deterministic=deterministic)

    buffer = min(config.shuffle_buffer, examples) if training else 0

    # A cache keeps the file order of its first pass; the buffer still reshuffles each epoch.
    cached = records(None).cache() if config.cache else None

    def one_epoch(epoch: tf.Tensor) -> tf.data.Dataset:
        # Shuffle seeds here are tensors (a function of the epoch). TF's get_seed compares them
        # with 0 in Python when the global seed is 0 (e.g. after keras.utils.set_random_seed(0))
        # and fails in graph mode; the order must depend on --seed and the epoch only anyway, so
        # the function traced here gets no graph-level seed.
        tf.compat.v1.set_random_seed(None)
        ds = cached if cached is not None else records(epoch if training else None)
        return ds.shuffle(buffer, seed=_seed(config.seed, epoch, 1)) if buffer else ds

    # Each epoch's order is a function of (seed, epoch), so every iterator (a resumed run, a
    # second fit call) sees the same stream.
    if training:
        ds = tf.data.Dataset.counter().flat_map(one_epoch)
    else:
        ds = one_epoch(tf.constant(0, tf.int64))
    stream = tf.constant(config.seed * 65536 + shard.index, tf.int64)
    ds = ds.enumerate().map(
        lambda k, element: transform(element, tf.stack([stream, k])),
        num_parallel_calls=tf.data.AUTOTUNE, deterministic=deterministic)
    ds = ds.batch(batch_size, drop_remainder=training)
    ds = ds.prefetch(config.prefetch or tf.data.AUTOTUNE)
    return Batches(ds.with_options(options(config)), examples)

