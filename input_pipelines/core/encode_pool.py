"""Encoding a converter's items on a pool of processes, in order, so output never depends on it.

The converters spend their time decoding and encoding images (or reading samples), one item at a
time and independently, so :class:`EncodePool` runs ``encode`` on ``--workers`` processes and
hands the results back in item order; the caller writes them in that order. Per-shard statistics
stay identical too: each item's statistics are computed alone (a fresh accumulator per item,
with ``workers=1`` as well) and merged into the shard's in item order, so the floating-point
sums happen in the same order whatever the number of workers. Workers are started with
``spawn`` (the parent has TensorFlow's threads running, which ``fork`` does not copy safely),
and each imports the converter's module, which costs a few seconds; the processes are kept
for the next conversion in this process (a converter run per split, or several in a script or
a test), and end with it.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from typing import Any, Protocol, TypeVar

from input_pipelines.core.errors import DataError

T = TypeVar("T")


class Accumulator(Protocol):
    """Per-shard statistics a converter keeps (e.g. channel means)."""

    def to_dict(self) -> dict[str, Any]: ...

    def merge(self, saved: dict[str, Any]) -> None: ...


# (item, accumulator of this item's statistics, or None) -> (record, smallest label, largest
# label). Must be picklable for several workers: a module-level function or a partial of one.
Encode = Callable[[T, Any], tuple[bytes, int, int]]
# what a worker hands back: the record, its label range and its statistics (to_dict) or None
Encoded = tuple[bytes, int, int, dict[str, Any] | None]


def available_cores() -> int:
    """The cores this process may run on (the ``--workers`` default)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (
        os.cpu_count() or 1)


def _encode_one(encode: Encode[T], new_accumulator: Callable[[], Accumulator] | None,
                item: T) -> Encoded:
    accumulator = new_accumulator() if new_accumulator is not None else None
    try:
        record, low, high = encode(item, accumulator)
    except DataError as err:
        # Back to the parent by pickling: a subclass whose constructor takes other arguments
        # (CorruptFileError) would not unpickle there, and its message would be lost.
        raise DataError(str(err)) from None
    return record, low, high, accumulator.to_dict() if accumulator is not None else None


_EXECUTORS: dict[int, ProcessPoolExecutor] = {}


def _executor(workers: int) -> ProcessPoolExecutor:
    """This process's pool of ``workers`` processes, started on first use."""
    if workers not in _EXECUTORS:
        _EXECUTORS[workers] = ProcessPoolExecutor(
            workers, mp_context=multiprocessing.get_context("spawn"))
    return _EXECUTORS[workers]


class EncodePool:
    """Runs :data:`Encode` functions on ``workers`` processes (in this one for 1).

    Raises:
        ValueError: ``workers`` is below 1.
    """

    def __init__(self, workers: int) -> None:
        if workers < 1:
            raise ValueError(f"--workers={workers} is not valid; give at least 1")
        self.workers = workers

    def __enter__(self) -> EncodePool:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, *exc: object) -> None:
        if exc_type is not None and self.workers in _EXECUTORS:
            # A failed conversion may leave tasks queued or a worker dead: start afresh.
            _EXECUTORS.pop(self.workers).shutdown(wait=False, cancel_futures=True)

    def map(self, encode: Encode[T], new_accumulator: Callable[[], Accumulator] | None,
            items: Sequence[T]) -> Iterator[Encoded]:
        """``encode`` of each of ``items`` with its own accumulator, in order."""
        one = functools.partial(_encode_one, encode, new_accumulator)
        if self.workers == 1 or len(items) < 2:
            return map(one, items)
        chunk = max(1, min(64, len(items) // (4 * self.workers)))
        return _executor(self.workers).map(one, items, chunksize=chunk)
