"""The shared tf.data mechanics: sharding, shuffling, determinism, repeat, cache, prefetch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from input_pipelines.core import mechanics
from input_pipelines.core.errors import DataError
from input_pipelines.core.files import shard_files, split_files
from input_pipelines.registry import Shard
from tests.pipeline_data import SHARDS_2, config


def write_ids(root: Path, files: int, per_file: int) -> list[str]:
    """TFRecord files whose records are the text of consecutive ids."""
    root.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in range(files):
        path = str(root / f"train-{f:05d}")
        with tf.io.TFRecordWriter(path) as writer:
            for r in range(per_file):
                writer.write(str(f * per_file + r).encode())
        paths.append(path)
    return paths


def parse(record: tf.Tensor) -> tf.Tensor:
    return tf.strings.to_number(record, tf.int32)


def transform(element: tf.Tensor, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    noise = tf.random.stateless_uniform([], tf.cast(seed, tf.int32))
    return tf.reshape(noise, [1, 1, 1]), element


def ids(paths: list[str], counts: list[int], shard: Shard, n: int, split: str = "train",
        **overrides: object) -> tuple[list[int], int]:
    cfg = config("unused", "imagenet", **overrides)
    batches = mechanics.batches(paths, counts, mechanics.read_tfrecords, parse, transform, cfg,
                                shard, split, batch_size=1)
    got = [int(y[0]) for _, y in batches.dataset.take(n).as_numpy_iterator()]
    return got, int(batches.examples or 0)


@pytest.mark.parametrize("record_sharding", [False, True])
def test_two_workers_cover_the_dataset_exactly_once_per_epoch(tmp_path, record_sharding):
    every = write_ids(tmp_path, files=4, per_file=5)
    seen = []
    for shard in SHARDS_2:
        mine = shard_files(every, shard, record_sharding)
        examples = 10
        got, reported = ids(mine, [5] * len(mine), shard, 2 * examples,
                            record_sharding=record_sharding)
        assert reported == examples
        first, second = got[:examples], got[examples:]
        assert sorted(first) == sorted(second)  # each epoch is the worker's whole share
        assert len(set(first)) == examples
        seen += first
    assert sorted(seen) == list(range(20))


def test_record_sharding_splits_one_file_and_counts_uneven_shares(tmp_path):
    every = write_ids(tmp_path, files=1, per_file=7)
    with pytest.raises(DataError, match="--record_sharding"):
        shard_files(every, SHARDS_2[1], record_sharding=False)
    shares = [ids(every, [7], s, 4 if s.index == 0 else 3, record_sharding=True)
              for s in SHARDS_2]
    assert [examples for _, examples in shares] == [4, 3]
    assert sorted(shares[0][0] + shares[1][0]) == list(range(7))
    assert mechanics.records_of_shard(7, Shard(2, 3)) == 2


def test_deterministic_order_depends_on_seed_and_epoch_and_resumes_with_skip(tmp_path):
    every = write_ids(tmp_path, files=4, per_file=5)
    shard = Shard()
    run1, _ = ids(every, [5] * 4, shard, 60)
    run2, _ = ids(every, [5] * 4, shard, 60)
    assert run1 == run2
    epochs = [run1[i:i + 20] for i in (0, 20, 40)]
    assert epochs[0] != epochs[1] != epochs[2]
    assert all(sorted(e) == list(range(20)) for e in epochs)
    other_seed, _ = ids(every, [5] * 4, shard, 20, seed=7)
    assert other_seed != epochs[0]
    cfg = config("unused", "imagenet")
    batches = mechanics.batches(every, [5] * 4, mechanics.read_tfrecords, parse, transform, cfg,
                                shard, "train", batch_size=1)
    resumed = list(batches.dataset.skip(25).take(10).as_numpy_iterator())
    full = list(batches.dataset.take(35).as_numpy_iterator())[25:]
    assert all(np.array_equal(a[0], b[0]) and a[1] == b[1] for a, b in zip(resumed, full,
                                                                             strict=True))


def test_validation_is_one_pass_in_file_order(tmp_path):
    every = write_ids(tmp_path, files=2, per_file=3)
    got, examples = ids(every, [3, 3], Shard(), 12, split="validation")
    assert examples == 6
    assert got == [0, 3, 1, 4, 2, 5]  # interleaved across the two files, unshuffled, once


def test_cache_and_fixed_prefetch_give_the_same_stream(tmp_path):
    every = write_ids(tmp_path, files=3, per_file=4)
    cached, _ = ids(every, [4] * 3, Shard(), 36, cache=True, prefetch=2)
    again, _ = ids(every, [4] * 3, Shard(), 36, cache=True, prefetch=2)
    assert cached == again
    epochs = [cached[i:i + 12] for i in (0, 12, 24)]
    assert all(sorted(e) == list(range(12)) for e in epochs)
    assert epochs[0] != epochs[1]  # the buffer reshuffles the cached records every epoch


def test_batches_are_static_and_options_are_set(tmp_path):
    every = write_ids(tmp_path, files=2, per_file=5)
    cfg = config("unused", "imagenet", prefetch=3)
    batches = mechanics.batches(every, [5, 5], mechanics.read_tfrecords, parse, transform, cfg,
                                Shard(), "train", batch_size=3)
    assert batches.dataset.element_spec[1].shape.as_list() == [3]
    opts = batches.dataset.options()
    assert opts.deterministic is True
    off = tf.data.experimental.AutoShardPolicy.OFF
    assert opts.experimental_distribute.auto_shard_policy == off


@pytest.mark.parametrize("record_sharding", [False, True])
def test_uneven_validation_shards_keep_a_partial_last_batch(tmp_path, record_sharding):
    every = write_ids(tmp_path, files=3, per_file=5)
    seen = []
    for shard in SHARDS_2:
        cfg = config("unused", "imagenet", record_sharding=record_sharding)
        mine = every if record_sharding else every[shard.index::2]
        batches = mechanics.batches(mine, [5] * len(mine), mechanics.read_tfrecords, parse,
                                    transform, cfg, shard, "validation", batch_size=4)
        sizes = [len(y) for _, y in batches.dataset.as_numpy_iterator()]
        assert sum(sizes) == batches.examples and sizes[-1] == (batches.examples - 1) % 4 + 1
        seen += [int(i) for _, y in batches.dataset.as_numpy_iterator() for i in y]
    assert sorted(seen) == list(range(15))  # 10 + 5 or 8 + 7: each example exactly once


def test_a_worker_without_validation_examples_gets_an_empty_dataset(tmp_path):
    every = write_ids(tmp_path, files=1, per_file=1)
    cfg = config("unused", "imagenet", record_sharding=True)
    args = (every, [1], mechanics.read_tfrecords, parse, transform, cfg, Shard(1, 2))
    batches = mechanics.batches(*args, "validation", batch_size=4)
    assert batches.examples == 0 and list(batches.dataset.as_numpy_iterator()) == []
    with pytest.raises(DataError, match="no train examples"):
        mechanics.batches(*args, "train", batch_size=4)


def test_split_layouts(tmp_path):
    (tmp_path / "a").mkdir()
    for name in ("train-0", "train-1", "validation-0", "manifest.json"):
        (tmp_path / "a" / name).write_bytes(b"")
    assert [Path(p).name for p in split_files(str(tmp_path / "a"), "train")] == ["train-0",
                                                                                   "train-1"]
    assert [Path(p).name for p in split_files(str(tmp_path / "a"), "validation")] == [
        "validation-0"]
    (tmp_path / "b" / "validation").mkdir(parents=True)
    (tmp_path / "b" / "validation" / "x.h5").write_bytes(b"")
    (tmp_path / "b" / "validation" / "notes.txt").write_bytes(b"")
    assert split_files(str(tmp_path / "b"), "validation", (".h5",)) == [
        str(tmp_path / "b" / "validation" / "x.h5")]
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "x.h5").write_bytes(b"")
    assert split_files(str(tmp_path / "c"), "train", (".h5",)) == [str(tmp_path / "c" / "x.h5")]
    assert split_files(str(tmp_path / "a" / "train-*"), "train") == [
        str(tmp_path / "a" / "train-0"), str(tmp_path / "a" / "train-1")]


def test_order_is_independent_of_a_global_seed_of_zero(tmp_path: Path) -> None:
    # keras.utils.set_random_seed(0) in a user's script used to break every file pipeline:
    # TF compared the per-epoch (tensor) shuffle seed with 0 in Python while tracing.
    from tensorflow.python.framework import random_seed

    paths = write_ids(tmp_path, files=3, per_file=4)
    shard = Shard(0, 1)
    before, _ = ids(paths, [4] * 3, shard, 24)
    try:
        tf.random.set_seed(0)
        after, _ = ids(paths, [4] * 3, shard, 24)
        assert random_seed.get_seed(None)[0] == 0  # the global seed is left as the user set it
    finally:
        tf.random.set_seed(None)
    assert after == before
    assert before[:12] != before[12:]  # a new order each epoch
