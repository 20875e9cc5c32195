"""Finding a split's files under ``--data_dir`` and giving each worker its part.

Layouts understood (``SPLIT`` is ``train`` or ``validation``):

- ``DATA_DIR/SPLIT-*`` (TFRecord shards as the converters and the ImageNet scripts name them),
- ``DATA_DIR/SPLIT/*`` (a folder per split),
- files directly in ``DATA_DIR`` (no split named): the training split only,
- a glob such as ``/data/train-*`` or a single file: the training split only.

They are the layout of every dataset that declares no other in its registry entry
(``files=``, ``has_validation=``; see :mod:`input_pipelines.registry`).

Every failure is a :class:`~input_pipelines.core.errors.DataError` naming the path.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Sequence

from input_pipelines.core.errors import DataError
from tfscale.cluster.shard import Shard

# Files that live beside the data but are not data.
SIDECARS = (".json", ".txt", ".md", ".tmp", ".lock", ".sha256")
GLOB_CHARS = "*?["


def is_glob(path: str) -> bool:
    """True when ``path`` is a glob pattern rather than a path."""
    return any(c in path for c in GLOB_CHARS)


def _is_data(path: str, suffixes: Sequence[str]) -> bool:
    name = os.path.basename(path)
    if name.startswith(".") or not os.path.isfile(path):
        return False
    if suffixes:
        return name.lower().endswith(tuple(suffixes))
    return not name.lower().endswith(SIDECARS)


def split_files(data_dir: str, split: str, suffixes: Sequence[str] = (),
                flag: str = "--data_dir") -> list[str]:
    """The sorted data files of ``split`` under ``data_dir`` (see the module docstring).

    Args:
        data_dir: a directory, a glob or a single file.
        split: ``"train"`` or ``"validation"``.
        suffixes: lower-case file name endings that mark data files (e.g. ``(".h5",)``); empty
            means every file except sidecars such as ``manifest.json``.
        flag: the option that gave ``data_dir``, for messages.

    Raises:
        DataError: ``data_dir`` is empty or does not exist, a glob matches nothing, or the split
            has no files.
    """
    if not data_dir:
        raise DataError(f"{flag} is empty; give the directory (or glob) of the dataset")
    if is_glob(data_dir):
        matches = sorted(p for p in glob.glob(data_dir) if _is_data(p, suffixes))
        if not matches:
            raise DataError(f"{flag}={data_dir}: the glob matched no data files")
        if split != "train":
            raise DataError(f"{flag}={data_dir} is a glob, which selects training files "
                            f"only; for {split} data give a directory holding {split}-* files")
        return matches
    if not os.path.exists(data_dir):
        raise DataError(f"{flag}={data_dir} does not exist")
    if os.path.isfile(data_dir):
        if split != "train":
            raise DataError(f"{flag}={data_dir} is a single file, which is training data "
                            f"only; for {split} data give a directory holding {split}-* files")
        return [data_dir]
    found = glob.glob(os.path.join(glob.escape(data_dir), f"{split}-*"))
    found += glob.glob(os.path.join(glob.escape(data_dir), split, "*"))
    files = sorted(p for p in found if _is_data(p, suffixes))
    if not files and split == "train" and not has_split_layout(data_dir):
        files = sorted(p for p in glob.glob(os.path.join(glob.escape(data_dir), "*"))
                       if _is_data(p, suffixes))
    if not files:
        wanted = f" ending in {', '.join(suffixes)}" if suffixes else ""
        raise DataError(f"{flag}={data_dir} has no {split} files{wanted}: expected "
                        f"{os.path.join(data_dir, split)}-* or {os.path.join(data_dir, split)}/*")
    return files


def has_validation_files(data_dir: str) -> bool:
    """True when ``data_dir`` is a directory holding ``validation-*`` files or a
    ``validation/`` folder: a validation split in the layouts above (the datasets' default
    ``has_validation=`` rule, see :func:`input_pipelines.registry.has_validation_split`)."""
    return os.path.isdir(data_dir) and bool(
        glob.glob(os.path.join(glob.escape(data_dir), "validation-*"))
        or os.path.isdir(os.path.join(data_dir, "validation")))


def has_split_layout(data_dir: str) -> bool:
    """True when ``data_dir`` names its splits (``train-*``, ``validation/`` ...)."""
    return any(glob.glob(os.path.join(glob.escape(data_dir), f"{s}{tail}"))
               for s in ("train", "validation") for tail in ("-*", ""))


RECORD_SHARDING_HINT = ("use --record_sharding to shard by record instead (every worker then "
                        "reads every file), or write more shards")


def shard_files(files: Sequence[str], shard: Shard, record_sharding: bool,
                unit: str = "files", hint: str = RECORD_SHARDING_HINT) -> list[str]:
    """The files worker ``shard`` reads: every ``count``-th file from ``index`` (file-level
    sharding), or all of them when records are sharded instead.

    Args:
        files: all files of the split, in a fixed order shared by every worker.
        shard: this worker's index and the number of workers.
        record_sharding: each worker reads every file and keeps every ``count``-th record.
        unit: what a file is called in the error message.
        hint: what the error message suggests doing about too few files.

    Raises:
        DataError: fewer files than workers under file-level sharding.
    """
    if record_sharding:
        return list(files)
    if len(files) < shard.count:
        first = os.path.dirname(files[0]) if files else "?"
        raise DataError(
            f"{len(files)} {unit} in {first} for {shard.count} workers: file-level sharding "
            f"needs at least one file per worker; {hint}")
    return list(files[shard.index::shard.count])


def data_root(data_dir: str) -> str:
    """The directory the dataset's files are named relative to: ``data_dir`` itself, a
    single file's folder, or the part of a glob before its first wildcard."""
    if is_glob(data_dir):
        head = data_dir[:min(data_dir.index(c) for c in GLOB_CHARS if c in data_dir)]
        return os.path.dirname(head) or "."
    return data_dir if os.path.isdir(data_dir) else os.path.dirname(data_dir) or "."
