"""A worker's files of one split, ready to read: found, sharded, staged, checked, counted.

The order matters for strictness: paths and globs are resolved first (naming what is missing),
then the worker's share is taken (failing when there are fewer files than workers), staged if
``--stage_dir`` is set, and finally every file is opened and counted by a format-specific
function that raises :class:`~input_pipelines.core.errors.CorruptFileError` for a damaged file. With
``--skip_corrupt`` such files are left out and reported instead.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Sequence
from typing import Any

from input_pipelines.core.checks import label_error
from input_pipelines.core.corrupt import CorruptFiles
from input_pipelines.core.errors import CorruptFileError
from input_pipelines.core.files import data_root, shard_files, split_files
from input_pipelines.core.manifest import entries_for
from input_pipelines.core.staging import stage
from input_pipelines.registry import Shard
from tfscale.config.settings import DataSettings

Counter = Callable[[str], int]  # path -> records in the file; raises CorruptFileError


@dataclasses.dataclass(frozen=True)
class WorkerFiles:
    """The files one worker reads, and where they came from."""

    paths: list[str]  # what to read (the staged copies when staging)
    sources: list[str]  # the original files, parallel to ``paths``
    counts: list[int]  # records per file
    entries: dict[str, dict[str, Any]]  # manifest entries by original path
    first_source: str  # the split's first file, a reference every worker shares
    record_sharding: bool = False  # each worker reads every file and keeps its own records

    def reading(self, config: DataSettings) -> DataSettings:
        """``config`` with the record-level sharding these files are read with."""
        return config.replace(record_sharding=self.record_sharding)

    @property
    def bytes(self) -> int:
        """Total size of the files."""
        return sum(os.path.getsize(p) for p in self.paths)

    def without(self, corrupt: Sequence[CorruptFileError], config: DataSettings, shard: Shard,
                split: str) -> WorkerFiles:
        """These files less the ``corrupt`` ones (named by source), reported.

        Raises:
            CorruptFileError: the first of ``corrupt``, unless ``config.skip_corrupt``.
        """
        if not corrupt:
            return self
        policy = CorruptFiles(config.skip_corrupt)
        policy.add_all(corrupt)
        policy.report(shard, split, len(self.paths))
        bad = policy.paths
        keep = [i for i, s in enumerate(self.sources) if s not in bad]
        return dataclasses.replace(
            self, paths=[self.paths[i] for i in keep], sources=[self.sources[i] for i in keep],
            counts=[self.counts[i] for i in keep])


def worker_files(config: DataSettings, shard: Shard, split: str, count: Counter,
                 suffixes: Sequence[str] = ()) -> WorkerFiles:
    """Finds, shards, stages, checks and counts the files of ``split`` for worker ``shard``.

    Args:
        config: supplies data_dir, record_sharding, stage_dir and skip_corrupt.
        shard: this worker.
        split: ``"train"`` or ``"validation"``.
        count: opens a file and returns its number of records (see :data:`Counter`).
        suffixes: file name endings of data files (empty: any file but sidecars).

    Raises:
        DataError: missing paths, too few files, a damaged file (unless skipped), a file whose
            record count differs from the manifest's.
    """
    every = split_files(config.data_dir, split, suffixes)
    # Evaluation counts every example once however the split is sharded, so a validation
    # split with fewer files than workers is sharded by record instead of refused.
    record_sharding = config.record_sharding or (split == "validation"
                                                 and len(every) < shard.count)
    mine = shard_files(every, shard, record_sharding)
    entries = entries_for(every)
    corrupt = CorruptFiles(config.skip_corrupt)
    paths = mine
    if config.stage_dir:
        staged = stage(mine, data_root(config.data_dir), config.stage_dir, shard, entries,
                       config.skip_corrupt)
        corrupt.add_all(staged.corrupt)
        paths = staged.paths
    sources = corrupt.keep(mine)
    kept_paths: list[str] = []
    kept_sources: list[str] = []
    counts: list[int] = []
    for path, source in zip(paths, sources, strict=True):
        try:
            records = _count(path, source, count, entries.get(source))
        except CorruptFileError as err:
            corrupt.add(err)
            continue
        kept_paths.append(path)
        kept_sources.append(source)
        counts.append(records)
    corrupt.report(shard, split, len(mine))
    return WorkerFiles(kept_paths, kept_sources, counts, entries, every[0], record_sharding)


def _count(path: str, source: str, count: Counter, entry: dict[str, Any] | None) -> int:
    try:
        records = count(path)
    except CorruptFileError as err:
        if path == source:
            raise
        raise CorruptFileError(source, f"{err.reason} (in its staged copy {path})") from None
    if entry is not None and int(entry["examples"]) != records:
        raise CorruptFileError(source, f"holds {records} records but the manifest lists "
                                       f"{entry['examples']}")
    return records


def check_manifest_labels(files: WorkerFiles, num_classes: int) -> None:
    """Checks each file's label range recorded in the manifest against ``num_classes``.

    Raises:
        DataError: naming the first file whose labels do not fit.
    """
    for source in files.sources:
        entry = files.entries.get(source)
        if entry is not None and "label_min" in entry:
            error = label_error(source, int(entry["label_min"]), int(entry["label_max"]),
                                num_classes)
            if error is not None:
                raise error
