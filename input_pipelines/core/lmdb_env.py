"""LMDB environments as datasets: where each split lives, and each worker's share of its keys.

Layouts understood under ``--data_dir`` (an environment is a directory holding ``data.mdb``):

- ``DATA_DIR/train/`` and ``DATA_DIR/validation/``, as ``folder_to_lmdb`` writes them;
- Caffe's names: ``DATA_DIR/*train*_lmdb`` and ``DATA_DIR/*val*_lmdb`` (its ImageNet example:
  ``ilsvrc12_train_lmdb``, ``ilsvrc12_val_lmdb``), or ``*test*_lmdb`` for validation (its MNIST
  and CIFAR-10 examples);
- ``DATA_DIR`` itself an environment: the training split only.

An environment's records are numbered in key order and cut into contiguous key ranges, which
play the part files play for TFRecord: each worker reads every ``count``-th range (or every
range, keeping every ``count``-th record, under ``--record_sharding``), so each record is read
once per epoch across workers, and the ranges go through the shared ``tf.data`` mechanics
(:mod:`input_pipelines.core.mechanics`: shuffled ranges, parallel interleave, exact
evaluation). Range sizes differ by at most one record and each worker gets as many ranges, so
the workers' shares differ by at most one record. A range is read by a generator holding one
read transaction and a cursor; ranges are small enough (at most :data:`MAX_RANGE` records,
about :data:`RANGES_PER_WORKER` per worker) that the interleave keeps several in flight.
``--stage_dir`` copies ``data.mdb`` (checked against the manifest when there is one) and the
worker reads the copy.
"""

from __future__ import annotations

import dataclasses
import glob
import os
import threading
from collections.abc import Iterator
from typing import Any

from input_pipelines.core.errors import CorruptFileError, DataError
from input_pipelines.core.files import data_root, shard_files
from input_pipelines.core.manifest import MANIFEST, entries_for
from input_pipelines.core.staging import stage
from input_pipelines.registry import Shard
from tfscale.config.settings import DataSettings

DATA_FILE = "data.mdb"
CAFFE_NAMES = {"train": ("*train*_lmdb",), "validation": ("*val*_lmdb", "*test*_lmdb")}
RANGES_PER_WORKER = 16
MAX_RANGE = 1024


def import_lmdb() -> Any:
    """The ``lmdb`` module.

    Raises:
        DataError: it is not installed, saying how to install it.
    """
    try:
        import lmdb
    except ImportError:
        raise DataError("--dataset=lmdb needs the lmdb package: pip install lmdb "
                        "(it is in requirements.txt)") from None
    return lmdb


def is_environment(path: str) -> bool:
    """True when ``path`` is a directory holding an LMDB ``data.mdb``."""
    return os.path.isfile(os.path.join(path, DATA_FILE))


def split_environment(data_dir: str, split: str) -> str:
    """The environment directory of ``split`` under ``data_dir`` (see the module docstring).

    Raises:
        DataError: ``data_dir`` is missing, holds no environment for ``split``, or several
            Caffe-named ones.
    """
    if not data_dir:
        raise DataError("--data_dir is empty; give the folder of the LMDB environments")
    if not os.path.isdir(data_dir):
        raise DataError(f"--data_dir={data_dir} does not exist or is not a folder")
    named = os.path.join(data_dir, split)
    if is_environment(named):
        return named
    for pattern in CAFFE_NAMES[split]:
        found = sorted(p for p in glob.glob(os.path.join(glob.escape(data_dir), pattern))
                       if is_environment(p))
        if len(found) > 1:
            raise DataError(f"--data_dir={data_dir} has several {split} environments "
                            f"({', '.join(found)}); keep one, or name it {named}")
        if found:
            return found[0]
    if split == "train" and is_environment(data_dir):
        return data_dir
    names = " or ".join(CAFFE_NAMES[split])
    raise DataError(f"--data_dir={data_dir} has no {split} LMDB environment: expected {named}/"
                    f"{DATA_FILE} (as folder_to_lmdb writes) or {names}/{DATA_FILE} (Caffe's "
                    "names)")


def data_files(data_dir: str, split: str) -> list[str]:
    """The ``data.mdb`` of ``split``'s environment (``lmdb``'s ``files=`` rule, see
    :mod:`input_pipelines.registry`).

    Raises:
        DataError: as :func:`split_environment`.
    """
    return [os.path.join(split_environment(data_dir, split), DATA_FILE)]


def has_validation(data_dir: str) -> bool:
    """True when ``data_dir`` has a ``validation/`` folder or a validation environment under
    Caffe's names (``*val*_lmdb``, ``*test*_lmdb``): ``lmdb``'s ``has_validation=`` rule (see
    :mod:`input_pipelines.registry`). A ``validation/`` folder without ``data.mdb`` counts, so
    that the run names what is missing instead of training without evaluation."""
    root = glob.escape(data_dir)
    caffe = (p for pattern in CAFFE_NAMES["validation"]
             for p in glob.glob(os.path.join(root, pattern)))
    return (os.path.isdir(os.path.join(data_dir, "validation"))
            or any(is_environment(p) for p in caffe))


def recognize(data_dir: str) -> str | None:
    """What ``--dataset=lmdb`` finds in ``data_dir`` (a recognizer, see
    :func:`input_pipelines.registry.recognize`): its training environment, or None."""
    try:
        train = split_environment(data_dir, "train")
    except DataError:
        return None
    where = os.path.normpath(os.path.join(os.path.relpath(train, data_dir), DATA_FILE))
    found = f"an LMDB training environment ({where})"
    return found + (f" with a {MANIFEST}" if entries_for([os.path.join(train, DATA_FILE)])
                    else "")


_OPEN: dict[str, tuple[tuple[int, int, int], Any]] = {}
_OPENING = threading.Lock()


def open_environment(path: str) -> Any:
    """``path`` opened read-only and without a lock file (the data does not change while
    training, and the folder may be read-only), once per process: LMDB refuses to open an
    environment twice in a process, and the readers of every key range share it.

    Raises:
        CorruptFileError: LMDB cannot open it.
        DataError: its ``data.mdb`` was replaced since this process opened it.
    """
    lmdb = import_lmdb()
    data = os.path.join(path, DATA_FILE)
    stat = os.stat(data)
    identity = (stat.st_ino, stat.st_size, stat.st_mtime_ns)
    with _OPENING:
        known = _OPEN.get(os.path.abspath(path))
        if known is not None:
            if known[0] != identity:
                raise DataError(f"{data} changed since this process opened it; LMDB cannot "
                                "open it again in the same process")
            return known[1]
        try:
            environment = lmdb.open(path, readonly=True, lock=False, subdir=True,
                                    max_readers=512)
        except lmdb.Error as err:
            raise CorruptFileError(data, f"cannot open the LMDB environment: {err}") from None
        _OPEN[os.path.abspath(path)] = (identity, environment)
        return environment


@dataclasses.dataclass(frozen=True)
class KeyRanges:
    """The key ranges of one split that one worker reads."""

    environment: str  # what to read (the staged copy when staging)
    source: str  # the original data.mdb, for messages
    names: list[str]  # ``SOURCE[begin:end]`` per range, the "files" of the mechanics
    counts: list[int]  # records per range
    starts: dict[str, bytes]  # first key of each range, by name
    entry: dict[str, Any] | None  # the manifest's entry for the environment
    record_sharding: bool

    def reading(self, config: DataSettings) -> DataSettings:
        """``config`` with the record-level sharding these ranges are read with."""
        return config.replace(record_sharding=self.record_sharding)


def range_bounds(records: int, workers: int) -> list[tuple[int, int]]:
    """``[begin, end)`` of each key range: a multiple of ``workers`` ranges (about
    :data:`RANGES_PER_WORKER` each, more when ranges would exceed :data:`MAX_RANGE` records)
    whose sizes differ by at most one, larger first, so dealing them round-robin gives every
    worker the same number of records to within one, as dealing records to shards does."""
    per_worker = max(RANGES_PER_WORKER, -(-records // (workers * MAX_RANGE)))
    count = min(records, workers * per_worker)
    size, larger = divmod(records, count)
    ends = [(i + 1) * size + min(i + 1, larger) for i in range(count)]
    return list(zip([0, *ends[:-1]], ends, strict=True))


def _range_starts(environment: Any, bounds: list[tuple[int, int]]) -> list[bytes]:
    """The first key of each range of ``bounds``, in key order (reads the keys only)."""
    begins = {begin for begin, _ in bounds}
    with environment.begin() as txn:
        return [bytes(key) for index, key in
                enumerate(txn.cursor().iternext(keys=True, values=False)) if index in begins]


def worker_ranges(config: DataSettings, shard: Shard, split: str) -> KeyRanges:
    """Finds, stages, checks and deals the key ranges of ``split`` for worker ``shard``.

    Raises:
        DataError: no environment, fewer ranges than workers (training), a damaged or staged
            copy that differs from the manifest, or a record count other than the manifest's.
    """
    source = os.path.join(split_environment(config.data_dir, split), DATA_FILE)
    entry = entries_for([source]).get(source)
    path = source
    if config.stage_dir:
        entries = {source: entry} if entry is not None else {}
        path = stage([source], data_root(config.data_dir), config.stage_dir, shard,
                     entries).paths[0]
    environment = open_environment(os.path.dirname(path))
    records = int(environment.stat()["entries"])
    if entry is not None and int(entry["examples"]) != records:
        raise CorruptFileError(source, f"holds {records} records but the manifest lists "
                                       f"{entry['examples']}")
    if records == 0:
        raise DataError(f"{source}: the LMDB environment holds no records")
    bounds = range_bounds(records, shard.count)
    starts = _range_starts(environment, bounds)
    names = [f"{source}[{begin}:{end}]" for begin, end in bounds]
    counts = [end - begin for begin, end in bounds]
    # As for files: evaluation counts every example once however the split is sharded, so a
    # validation split with fewer ranges than workers is sharded by record instead of refused.
    sharding = config.record_sharding or (split == "validation" and len(names) < shard.count)
    mine = shard_files(names, shard, sharding, unit="key ranges",
                       hint="use fewer workers, or --record_sharding")
    count_of = dict(zip(names, counts, strict=True))
    return KeyRanges(os.path.dirname(path), source, mine, [count_of[n] for n in mine],
                     dict(zip(names, starts, strict=True)), entry, sharding)


def read_range(environment: str, start: bytes, first: int,
               count: int) -> Iterator[tuple[int, bytes, Any]]:
    """(global index, key, value) of ``count`` records from key ``start``, numbered from
    ``first``. Values are memoryviews into the map, valid until the next record is read.

    Raises:
        DataError: ``start`` is missing (the environment changed since it was dealt).
    """
    with open_environment(environment).begin(buffers=True) as txn:
        cursor = txn.cursor()
        if not cursor.set_key(start):
            raise DataError(f"{environment}: key {start!r} is gone; the environment changed "
                            "while it was read")
        for offset in range(count):
            yield first + offset, bytes(cursor.key()), cursor.value()
            if not cursor.next():
                return
