"""events.jsonl: a run's milestones, one JSON object per line, in the spirit of MLPerf logging.

Written by the chief only, appended (a resumed run adds to the same file) and flushed line by
line, so a run that dies leaves every event before its death. Each line has ``event`` and
``time`` (Unix seconds) first, then the event's fields:

- ``run_start``: the config summary (model, dataset, strategy, workers, global batch, steps).
- ``epoch_end``: ``epoch``, ``step``, ``metrics`` (the training metrics of the epoch).
- ``eval``: ``step``, ``epoch``, ``seconds``, ``examples``, ``metrics`` (as in results.json).
- ``target_reached``: ``metric``, ``value``, ``direction``, ``step``, ``epoch``, ``seconds``.
- ``run_stop``: ``status`` (one of :data:`STATUSES`) and ``step``.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from tfscale.cluster import rank_zero

STATUSES = ("success", "target_reached", "failed", "preempted", "non_finite")


class EventLog:
    """Appends events to ``path`` (chief only; other ranks write nothing)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    @rank_zero.rank_zero_only
    def emit(self, event: str, **fields: Any) -> None:
        """Appends one event line and flushes it to the file."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        line = json.dumps({"event": event, "time": time.time(), **fields})
        with self.path.open("a") as f:
            f.write(line + "\n")
            f.flush()


def read_events(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    """The events of an events.jsonl file, in order."""
    text = Path(path).read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]
