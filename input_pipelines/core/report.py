"""Lines for the user from inside the pipelines: warnings and progress, on stderr.

Every worker reports its own data (its shards, its skipped files), so lines carry the worker's
index when there is more than one worker.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from input_pipelines.registry import Shard
from tfscale.durations import clock


def prefix(shard: Shard | None) -> str:
    """``"worker I: "`` when there are several workers, else ``""``."""
    return f"worker {shard.index}: " if shard is not None and shard.count > 1 else ""


def warn(shard: Shard | None, message: str) -> None:
    """Prints ``warning: MESSAGE`` on stderr, flushed so launchers stream it."""
    print(f"{prefix(shard)}warning: {message}", file=sys.stderr, flush=True)


def note(shard: Shard | None, message: str) -> None:
    """Prints an informational line on stderr."""
    print(f"{prefix(shard)}{message}", file=sys.stderr, flush=True)


def _mib(n: float) -> str:
    return f"{n / 2**20:.1f}"


class Progress:
    """A progress line for a job of ``total_items`` items and ``total_bytes`` bytes.

    On a terminal the line is redrawn in place; otherwise (logs, launchers) a line is printed at
    most every ``interval`` seconds, and always at the end. With ``inside`` (e.g. "samples"),
    the line also counts what the items hold and its rate, for files whose number of images is
    known only once read.
    """

    def __init__(self, label: str, total_items: int, total_bytes: int,
                 stream: TextIO | None = None, interval: float = 5.0,
                 unit: str = "files", inside: str = "") -> None:
        self.label = label
        self.unit = unit
        self.inside = inside
        self.total_items = total_items
        self.total_bytes = total_bytes
        self.items = 0
        self.bytes = 0
        self.contents = 0
        self.stream = stream or sys.stderr
        self.interval = interval
        self.start = time.monotonic()
        self._last = 0.0
        self._tty = self.stream.isatty()

    def line(self) -> str:
        """The current state, e.g. ``staging: 3/8 files, 1.0/4.0 MiB, 2.5 MiB/s, ETA 0:00:03``
        or, without a byte total, ``writing out: 300/1797 images, 150.0 images/s, ETA 0:00:10``.
        """
        elapsed = max(time.monotonic() - self.start, 1e-9)
        if self.total_bytes:
            amount = (f"{_mib(self.bytes)}/{_mib(self.total_bytes)} MiB, "
                      f"{_mib(self.bytes / elapsed)} MiB/s")
            done = self.bytes / self.total_bytes
        else:
            amount = f"{self.items / elapsed:.1f} {self.unit}/s"
            done = self.items / max(self.total_items, 1)
        left = f"ETA {clock(elapsed * (1 - done) / done)}" if 0 < done < 1 else (
            f"{clock(elapsed)} elapsed")
        inside = (f", {self.contents} {self.inside} ({self.contents / elapsed:.1f} "
                  f"{self.inside}/s)" if self.inside else "")
        return (f"{self.label}: {self.items}/{self.total_items} {self.unit}{inside}, {amount}, "
                f"{left}")

    def advance(self, nbytes: int = 0, items: int = 0, contents: int = 0) -> None:
        """Counts ``nbytes`` more bytes, ``items`` more finished items and ``contents`` more of
        what they hold; redraws if due."""
        self.bytes += nbytes
        self.items += items
        self.contents += contents
        now = time.monotonic()
        if self._tty or now - self._last >= self.interval:
            self._last = now
            self._draw(final=False)

    def done(self) -> None:
        """Prints the final line."""
        self._draw(final=True)

    def _draw(self, final: bool) -> None:
        if self._tty:
            end = "\n" if final else ""
            print(f"\r{self.line()}", end=end, file=self.stream, flush=True)
        else:
            print(self.line(), file=self.stream, flush=True)
