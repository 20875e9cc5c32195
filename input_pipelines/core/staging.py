"""Node-local staging: copy this worker's files to fast local storage before training.

Each worker copies only the files it reads (its shards; every file under record-level
sharding), keeping their layout under ``--stage_dir``. A copy goes to a temporary name and is
renamed into place once its SHA-256 matches, so a reader never sees a partial file. The
expected checksum comes from the manifest, else from the source (hashed while copying and kept
in a ``FILE.sha256`` sidecar with the source's size and modification time). A file already
staged is re-hashed and skipped when it matches; a damaged one is copied again. Workers that
share a node start at different files, so concurrent copies of the same file are rare (and
harmless: each writes its own temporary file).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
from collections.abc import Sequence
from typing import Any

from input_pipelines.core import report
from input_pipelines.core.corrupt import CorruptFiles
from input_pipelines.core.errors import CorruptFileError, DataError
from input_pipelines.core.manifest import CHUNK, sha256_file
from input_pipelines.registry import Shard
from tfscale.training.files import write_json_atomic

SIDECAR = ".sha256"


@dataclasses.dataclass
class Staged:
    """What :func:`stage` did."""

    paths: list[str]
    copied: list[str] = dataclasses.field(default_factory=list)
    recopied: list[str] = dataclasses.field(default_factory=list)
    skipped: list[str] = dataclasses.field(default_factory=list)
    corrupt: list[CorruptFileError] = dataclasses.field(default_factory=list)
    bytes_copied: int = 0


def _expected(source: str, entry: dict[str, Any] | None, sidecar: str) -> tuple[int, str] | None:
    """(size, sha256) the staged copy of ``source`` must have, if known without reading it."""
    if entry is not None:
        return int(entry["bytes"]), str(entry["sha256"])
    if not os.path.isfile(sidecar):
        return None
    try:
        with open(sidecar) as f:
            known = json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
    stat = os.stat(source)
    if (known.get("source") != os.path.abspath(source) or known.get("bytes") != stat.st_size
            or known.get("mtime_ns") != stat.st_mtime_ns):
        return None
    return int(known["bytes"]), str(known["sha256"])


def _copy(source: str, dest: str, progress: report.Progress) -> tuple[str, str]:
    """Copies ``source`` to a temporary file beside ``dest``; returns its path and SHA-256."""
    os.makedirs(os.path.dirname(dest) or ".", exist_ok=True)
    tmp = f"{dest}.tmp.{os.getpid()}"
    digest = hashlib.sha256()
    try:
        with open(source, "rb") as src, open(tmp, "wb") as dst:
            while block := src.read(CHUNK):
                digest.update(block)
                dst.write(block)
                progress.advance(len(block))
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    return tmp, digest.hexdigest()


def _check_space(stage_dir: str, needed: int) -> None:
    os.makedirs(stage_dir, exist_ok=True)
    free = shutil.disk_usage(stage_dir).free
    if needed > free:
        raise DataError(f"--stage_dir={stage_dir} has {free / 2**30:.2f} GiB free but this "
                        f"worker's files need {needed / 2**30:.2f} GiB")


def stage(files: Sequence[str], root: str, stage_dir: str, shard: Shard,
          entries: dict[str, dict[str, Any]], skip_corrupt: bool = False) -> Staged:
    """Copies ``files`` (under ``root``) to ``stage_dir`` unless already staged and intact.

    Args:
        files: the files this worker reads.
        root: the directory ``files`` are named relative to; the layout below it is kept.
        stage_dir: node-local destination.
        shard: this worker (its local index spreads the starting file among a node's workers).
        entries: manifest entries by source path, for the expected sizes and checksums.
        skip_corrupt: leave out (and report) sources that do not match the manifest instead
            of failing.

    Returns:
        The staged paths (in the order of ``files``) and what was copied or skipped.

    Raises:
        CorruptFileError: a source does not match its manifest checksum (unless skipped).
        DataError: ``stage_dir`` lacks the space, or a copy fails.
    """
    dests = {f: os.path.join(stage_dir, os.path.relpath(f, root)) for f in files}
    corrupt = CorruptFiles(skip_corrupt)
    result = Staged(paths=[], corrupt=corrupt.found)
    todo: list[str] = []
    for source in files:
        dest = dests[source]
        expected = _expected(source, entries.get(source), dest + SIDECAR)
        if expected is None or not os.path.isfile(dest):
            todo.append(source)
        elif os.path.getsize(dest) == expected[0] and sha256_file(dest) == expected[1]:
            result.skipped.append(source)
        else:
            result.recopied.append(source)
            todo.append(source)
    start = (shard.local_index * len(todo)) // shard.local_count if todo else 0
    order = todo[start:] + todo[:start]
    needed = sum(os.path.getsize(f) for f in order)
    _check_space(stage_dir, needed)
    progress = report.Progress(f"{report.prefix(shard)}staging to {stage_dir}", len(order), needed)
    for source in order:
        try:
            tmp, sha = _copy(source, dests[source], progress)
        except OSError as err:
            raise DataError(f"staging {source} to {dests[source]} failed: {err}") from None
        entry = entries.get(source)
        if entry is not None and sha != entry["sha256"]:
            os.remove(tmp)
            bad = CorruptFileError(source, "its SHA-256 differs from the manifest's "
                                           f"({sha[:12]}... vs {str(entry['sha256'])[:12]}...)")
            corrupt.add(bad)
            continue
        os.replace(tmp, dests[source])
        stat = os.stat(source)
        write_json_atomic(dests[source] + SIDECAR, {
            "source": os.path.abspath(source), "bytes": stat.st_size,
            "mtime_ns": stat.st_mtime_ns, "sha256": sha})
        result.bytes_copied += stat.st_size
        progress.advance(items=1)
        if source not in result.recopied:
            result.copied.append(source)
    if order:
        progress.done()
    report.note(shard, f"staged {len(files)} file(s) in {stage_dir}: copied "
                       f"{len(result.copied) + len(result.recopied)}, already there and intact "
                       f"{len(result.skipped)}")
    for damaged in result.recopied:
        report.warn(shard, f"staged copy {dests[damaged]} was damaged; copied it again")
    dropped = {e.path for e in result.corrupt}
    result.paths = [dests[f] for f in files if f not in dropped]
    return result
