"""Writing a dataset as balanced TFRecord shards with a manifest, resumably.

The converters hand over, per split, the list of items to write and how to encode one. Items
are dealt round-robin into ``N`` shards (sizes differ by at most one) named
``SPLIT-00000-of-0000N.tfrecord``. Each shard is written to a temporary file and renamed when
complete, then recorded in ``manifest.json`` (examples, bytes, SHA-256, label range, a
fingerprint of its inputs, and any per-shard statistics the converter keeps). Re-running skips
every shard whose file still matches its manifest entry and inputs, and removes shards of this
split that an earlier run with another shard count left behind. Items are encoded on an
:class:`~input_pipelines.core.encode_pool.EncodePool` (``--workers``) and written in order, so
the shards are the same whatever the number of workers.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

from input_pipelines.core.encode_pool import Accumulator, Encode, EncodePool, available_cores
from input_pipelines.core.manifest import MANIFEST, read_json, sha256_file
from input_pipelines.core.report import Progress
from tfscale.training.files import write_json_atomic

T = TypeVar("T")


def shard_name(split: str, index: int, count: int) -> str:
    """``train-00003-of-00008.tfrecord``."""
    return f"{split}-{index:05d}-of-{count:05d}.tfrecord"


def deal(items: int, shards: int) -> list[list[int]]:
    """Item indices of each of ``shards`` shards, round-robin (balanced to within one)."""
    return [list(range(i, items, shards)) for i in range(shards)]


def fingerprint(identities: Sequence[str]) -> str:
    """SHA-256 of the inputs' identities (e.g. path, size and mtime of each)."""
    return hashlib.sha256("\n".join(identities).encode()).hexdigest()


def load_manifest(out_dir: str, header: dict[str, Any], fmt: str = "tfrecord") -> dict[str, Any]:
    """The manifest of ``out_dir`` (a new one from ``header`` when absent or describing
    different data, e.g. other classes), for data files in format ``fmt``."""
    path = os.path.join(out_dir, MANIFEST)
    if os.path.isfile(path):
        manifest = read_json(path)
        if manifest.get("format") == fmt and all(manifest.get(k) == v
                                                 for k, v in header.items()):
            manifest.setdefault("splits", {})
            return dict(manifest)
    return {**header, "version": 1, "format": fmt, "splits": {}}


def still_valid(out_dir: str, old: dict[str, Any] | None, inputs: str) -> bool:
    """True when the file of manifest entry ``old`` was written from ``inputs`` (a
    :func:`fingerprint`) and still has the size and checksum recorded."""
    if old is None or old.get("inputs") != inputs:
        return False
    path = os.path.join(out_dir, old["file"])
    return (os.path.isfile(path) and os.path.getsize(path) == old["bytes"]
            and sha256_file(path) == old["sha256"])


def write_split(out_dir: str, manifest: dict[str, Any], split: str, items: Sequence[T],
                identities: Sequence[str], shards: int, encode: Encode[T],
                new_accumulator: Callable[[], Accumulator] | None, progress: Progress,
                pool: EncodePool | None = None) -> list[str]:
    """Writes ``items`` as ``shards`` shards of ``split``, updating ``manifest`` on disk after
    each; returns the names of shards skipped as already written.

    Args:
        out_dir: output folder (holds the shards and manifest.json).
        manifest: the manifest being built (see :func:`load_manifest`); updated in place.
        split: ``"train"`` or ``"validation"``.
        items: what to write, in order.
        identities: one string per item that changes when the item's content does.
        shards: number of shards.
        encode: serializes one item (see :data:`Encode`).
        new_accumulator: makes the per-shard statistics object passed to ``encode``.
        progress: advanced by one per item.
        pool: encodes the items (in this process when ``None``).
    """
    pool = pool or EncodePool(1)
    old = {e["file"]: e for e in manifest["splits"].get(split, {}).get("shards", [])}
    done: list[dict[str, Any]] = []
    skipped = []
    for index, members in enumerate(deal(len(items), shards)):
        name = shard_name(split, index, shards)
        inputs = fingerprint([identities[i] for i in members])
        if still_valid(out_dir, old.get(name), inputs):
            done.append(old[name])
            skipped.append(name)
            progress.advance(items=len(members))
        else:
            done.append(_write_shard(out_dir, name, [items[i] for i in members], inputs,
                                     encode, new_accumulator, progress, pool))
        manifest["splits"][split] = {"examples": sum(e["examples"] for e in done),
                                     "shards": done}
        write_json_atomic(os.path.join(out_dir, MANIFEST), manifest)
    for stale in sorted(set(old) - {e["file"] for e in done}):
        if os.path.isfile(os.path.join(out_dir, stale)):
            os.remove(os.path.join(out_dir, stale))
    return skipped


def _write_shard(out_dir: str, name: str, items: Sequence[T], inputs: str, encode: Encode[T],
                 new_accumulator: Callable[[], Accumulator] | None,
                 progress: Progress, pool: EncodePool) -> dict[str, Any]:
    import tensorflow as tf  # here: a converter's --help answers without it

    path = os.path.join(out_dir, name)
    tmp = f"{path}.tmp.{os.getpid()}"
    accumulator = new_accumulator() if new_accumulator else None
    low, high = None, None
    try:
        with tf.io.TFRecordWriter(tmp) as writer:
            for record, lo, hi, stats in pool.map(encode, new_accumulator, items):
                writer.write(record)
                low = lo if low is None else min(low, lo)
                high = hi if high is None else max(high, hi)
                if accumulator is not None and stats is not None:
                    accumulator.merge(stats)
                progress.advance(items=1)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    os.replace(tmp, path)
    size = os.path.getsize(path)
    entry: dict[str, Any] = {"file": name, "examples": len(items), "bytes": size,
                             "sha256": sha256_file(path), "inputs": inputs}
    if low is not None:
        entry.update(label_min=low, label_max=high)
    if accumulator is not None:
        entry["stats"] = accumulator.to_dict()
    return entry


def converter_parser(prog: str, description: str, input_help: str,
                     shards: bool = True) -> argparse.ArgumentParser:
    """The arguments every converter shares: input and output folders, and the shard counts
    when it writes shards."""
    parser = argparse.ArgumentParser(prog=f"python -m {prog}", description=description)
    parser.add_argument("--input_dir", required=True, help=input_help)
    parser.add_argument("--output_dir", required=True, help="Where to write the dataset.")
    parser.add_argument("--workers", type=int, default=available_cores(),
                        help="Processes that encode (default: this machine's cores); the "
                        "output is the same for any number.")
    if shards:
        parser.add_argument("--shards", type=int, default=8, help="Training shards.")
        parser.add_argument("--validation_shards", type=int, default=2,
                            help="Validation shards.")
    return parser


def run_converter(output_dir: str, convert: Callable[[], dict[str, list[str]]]) -> int:
    """Runs ``convert`` as a command: one ``error:`` line and exit code 2 for bad input."""
    try:
        skipped = convert()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    kept = sum(len(s) for s in skipped.values())
    print(f"wrote {output_dir} (skipped {kept} shard(s) already written and verified)")
    return 0
