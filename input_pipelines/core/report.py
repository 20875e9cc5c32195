"""Lines for the user from inside the pipelines: warnings and progress, on stderr.

Every worker reports its own data (its shards, its skipped files), so lines carry the worker's
index when there is more than one worker.
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

from input_pipelines.registry import Shard
from tfscale.training.durations import clock


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

    On a terminal the line is redrawn in place; otherwise (logs, launchers) a line is printed
    every ``interval`` seconds, and always at the end. With ``inside`` (e.g. "samples"), the
    line also counts what the items hold and its rate, for files whose number of images is
    known only once read. Rates and the ETA are measured from the end of the first item, which
    carries the start-up (a pool's processes import TensorFlow: seconds).
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
        self._last = self.start
        self._first: tuple[float, int, int, int] | None = None  # (time, items, bytes, contents)
        self._tty = self.stream.isatty()
        self._shown = ""

    def line(self) -> str:
        """The current state, e.g. ``staging: 3/8 files, 1.0/4.0 MiB, 2.5 MiB/s, ETA 0:00:03``
        or, without a byte total, ``writing out: 300/1797 images, 150.0 images/s, ETA 0:00:10``.
        """
        now = time.monotonic()
        elapsed = max(now - self.start, 1e-9)
        measured = self._first is not None and self.items > self._first[1]
        since = self._first if self._first is not None and measured else (self.start, 0, 0, 0)
        span = max(now - since[0], 1e-9)
        if self.total_bytes:
            rate = (self.bytes - since[2]) / span
            amount = (f"{_mib(self.bytes)}/{_mib(self.total_bytes)} MiB, "
                      f"{_mib(rate)} MiB/s")
            done, left_over = self.bytes / self.total_bytes, self.total_bytes - self.bytes
        else:
            rate = (self.items - since[1]) / span
            amount = f"{rate:.1f} {self.unit}/s"
            done = self.items / max(self.total_items, 1)
            left_over = self.total_items - self.items
        if done >= 1 or not done:
            left = f"{clock(elapsed)} elapsed"
        else:
            left = f"ETA {clock(left_over / rate)}" if measured and rate > 0 else "ETA ?"
        inside = (f", {self.contents} {self.inside} ({(self.contents - since[3]) / span:.1f} "
                  f"{self.inside}/s)" if self.inside else "")
        return (f"{self.label}: {self.items}/{self.total_items} {self.unit}{inside}, {amount}, "
                f"{left}")

    def advance(self, nbytes: int = 0, items: int = 0, contents: int = 0) -> None:
        """Counts ``nbytes`` more bytes, ``items`` more finished items and ``contents`` more of
        what they hold; redraws if due."""
        self.bytes += nbytes
        self.items += items
        self.contents += contents
        if self._first is None and self.items:
            self._first = (time.monotonic(), self.items, self.bytes, self.contents)
        now = time.monotonic()
        if self._tty or now - self._last >= self.interval:
            self._last = now
            self._draw(final=False)

    def done(self) -> None:
        """Prints the final line (in a log, unless the last line printed says the same)."""
        self._draw(final=True)

    def _draw(self, final: bool) -> None:
        line = self.line()
        if self._tty:
            end = "\n" if final else ""
            print(f"\r{line}", end=end, file=self.stream, flush=True)
        elif line != self._shown:
            print(line, file=self.stream, flush=True)
        self._shown = line
