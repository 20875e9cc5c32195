"""Where Horovod's time goes in training, from its timeline (``--horovod_timeline``).

Horovod's timeline is a Chrome trace: one "process" per tensor, and on it the activities of
that tensor's collective as begin/end pairs, nested: ``NEGOTIATE_ALLREDUCE`` (from the rank
enqueuing the tensor until every rank has and the coordinator says go: it includes waiting for
the slowest rank and for the next cycle), then ``ALLREDUCE`` with ``MEMCPY_IN_FUSION_BUFFER``,
``MPI_ALLREDUCE`` (or ``GLOO_ALLREDUCE``, ...) and ``MEMCPY_OUT_FUSION_BUFFER`` inside it.
Tensors fused into one message carry the same activity at the same time, each on its own
process; :func:`summarize` counts such a group once, as one message, and the negotiations of
tensors that wait at the same time once, as one wait.

A timeline is written while the job runs, so a file of a job that still runs, or was killed,
ends without its closing bracket; :func:`load` reads it all the same.

    python -m tfscale.cli.timeline MODEL_DIR [--skip 0.1]   (or the timeline file itself)
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path
from typing import Any

#: The timeline's file in the model directory (``--horovod_timeline``).
TIMELINE_FILE = "horovod_timeline.json"


@dataclasses.dataclass(frozen=True)
class Span:
    """One activity of one tensor: begin and duration in microseconds since the timeline's
    start."""

    name: str
    start_us: float
    duration_us: float

    @property
    def end_us(self) -> float:
        return self.start_us + self.duration_us


@dataclasses.dataclass(frozen=True)
class Activity:
    """One activity over the part of the timeline summarized, per message (:func:`messages`)."""

    name: str
    messages: int
    median_ms: float
    mean_ms: float
    total_s: float
    share: float  # of the wall time the summarized messages span


def load(path: Path) -> list[dict[str, Any]]:
    """The events of a Horovod timeline file, also one that a running or killed job left open.

    Raises:
        ValueError: naming the file, for one that is not a JSON list of events.
    """
    text = path.read_text().strip().rstrip(",")
    if text.startswith("[") and not text.endswith("]"):
        text += "]"
    try:
        events = json.loads(text or "[]")
    except json.JSONDecodeError as err:
        raise ValueError(f"{path}: not a Horovod timeline (a JSON list of trace events): "
                         f"{err}") from None
    if not isinstance(events, list):
        raise ValueError(f"{path}: not a Horovod timeline: expected a JSON list of trace "
                         f"events, found {type(events).__name__}")
    return [e for e in events if isinstance(e, dict)]


def spans(events: Iterable[dict[str, Any]]) -> list[Span]:
    """Every begin/end pair of the timeline, matched per tensor (they nest), by start time.
    A begin with no end (the job stopped inside it) is left out."""
    open_: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    found = []
    for event in events:
        pid, phase = event.get("pid"), event.get("ph")
        if phase == "B":
            open_[pid].append(event)
        elif phase == "E" and open_[pid]:
            begin = open_[pid].pop()
            found.append(Span(str(begin.get("name")), float(begin["ts"]),
                              float(event["ts"]) - float(begin["ts"])))
    return sorted(found, key=lambda s: s.start_us)


def messages(found: Iterable[Span]) -> dict[str, list[Span]]:
    """Per activity name, one span per message: the spans of tensors fused into one message
    overlap in time, so each group of overlapping spans of a name is one message, from its
    first start to its last end. For negotiations that is one wait: from the first of the
    waiting tensors being enqueued to the last one's go."""
    by_name: dict[str, list[Span]] = defaultdict(list)
    for span in found:
        group = by_name[span.name]
        if group and span.start_us < group[-1].end_us:
            last = group[-1]
            group[-1] = dataclasses.replace(
                last, duration_us=max(last.end_us, span.end_us) - last.start_us)
        else:
            group.append(span)
    return dict(by_name)


def summarize(events: Iterable[dict[str, Any]], skip: float = 0.1) -> list[Activity]:
    """Each activity's messages after the first ``skip`` fraction of the timeline's time (the
    start-up: broadcasts, the first negotiation of every tensor, the fusion buffer's
    allocation), in the order of a collective's life (negotiation first), then by name.

    Raises:
        ValueError: for ``skip`` outside [0, 1), or a timeline with no collective after it.
    """
    if not 0 <= skip < 1:
        raise ValueError(f"skip={skip}: expected a fraction of the timeline in [0, 1)")
    found = spans(events)
    if not found:
        raise ValueError("the timeline has no collective (no begin/end pair)")
    start, end = found[0].start_us, max(s.end_us for s in found)
    cut = start + skip * (end - start)
    kept = [s for s in found if s.start_us >= cut]
    if not kept:
        raise ValueError(f"the timeline has no collective after its first {skip:.0%}")
    wall_us = max(s.end_us for s in kept) - kept[0].start_us
    rows = []
    for name, group in messages(kept).items():
        durations = [s.duration_us for s in group]
        rows.append(Activity(name, len(group), statistics.median(durations) / 1e3,
                             statistics.mean(durations) / 1e3, sum(durations) / 1e6,
                             sum(durations) / wall_us if wall_us > 0 else 0.0))
    return sorted(rows, key=lambda a: (_life_order(a.name), a.name))


#: Where an activity comes in a collective's life; the transport's own (MPI_ALLREDUCE,
#: GLOO_ALLREDUCE, ...) between the copies in and out of the fusion buffer.
_LIFE = (("NEGOTIATE", 0), ("ALLREDUCE", 1), ("MEMCPY_IN", 2), ("MEMCPY_OUT", 4))


def _life_order(name: str) -> int:
    return next((order for prefix, order in _LIFE if name.startswith(prefix)), 3)


def table(rows: Iterable[Activity]) -> str:
    """The activities as a Markdown table."""
    lines = ["| activity | messages | median ms | mean ms | total s | of wall time |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {a.name} | {a.messages} | {a.median_ms:.2f} | {a.mean_ms:.2f} | "
              f"{a.total_s:.2f} | {a.share:.0%} |" for a in rows]
    return "\n".join(lines)
