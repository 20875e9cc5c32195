"""Horovod's timeline summed up per activity (tfscale.exchange.horovod_timeline and
``python -m tfscale.cli.timeline``), on timelines written here in Horovod's format; the
summary of a real one is in tests/test_profiling.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tfscale.cli import timeline as cli
from tfscale.exchange.horovod_timeline import TIMELINE_FILE, load, messages, spans, summarize

TENSORS = ("grad_a", "grad_b", "grad_c")


def _step(start: float, negotiate: float, mpi: float) -> list[dict[str, Any]]:
    """One step as Horovod writes it: the three tensors negotiate (the last enqueued 1 ms after
    the first), then go as one fused message: a copy in, the all-reduce, a copy out."""
    events: list[dict[str, Any]] = []
    for pid, _ in enumerate(TENSORS, 1):
        ts = start + (pid - 1) * 500
        events += [{"ph": "B", "name": "NEGOTIATE_ALLREDUCE", "ts": ts, "pid": pid},
                   {"ph": "E", "ts": start + negotiate, "pid": pid}]
    at = start + negotiate
    for pid, _ in enumerate(TENSORS, 1):
        events.append({"ph": "B", "name": "ALLREDUCE", "ts": at + pid, "pid": pid})
    for name, length in (("MEMCPY_IN_FUSION_BUFFER", 1000), ("MPI_ALLREDUCE", mpi),
                         ("MEMCPY_OUT_FUSION_BUFFER", 1000)):
        for pid, _ in enumerate(TENSORS, 1):
            events += [{"ph": "B", "name": name, "ts": at + pid, "pid": pid},
                       {"ph": "E", "ts": at + length + pid, "pid": pid}]
        at += length + 10
    for pid, _ in enumerate(TENSORS, 1):
        events.append({"ph": "E", "ts": at + pid, "pid": pid})
    return events


def _timeline(steps: int = 10, mpi: float = 8000) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = [
        {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": name}}
        for pid, name in enumerate(TENSORS, 1)]
    for i in range(steps):
        events += _step(i * 20000, 5000, mpi)
    return events


def test_fused_tensors_are_one_message_and_each_activity_is_timed() -> None:
    rows = {row.name: row for row in summarize(_timeline(), skip=0.0)}
    assert rows["MPI_ALLREDUCE"].messages == 10  # three tensors, one message per step
    assert rows["MPI_ALLREDUCE"].median_ms == pytest.approx(8.002)
    assert rows["MEMCPY_IN_FUSION_BUFFER"].median_ms == pytest.approx(1.002)
    # The three tensors' negotiations overlap: one 5 ms wait per step, from the first enqueue.
    assert rows["NEGOTIATE_ALLREDUCE"].messages == 10
    assert rows["NEGOTIATE_ALLREDUCE"].median_ms == pytest.approx(5.0)
    # The step is 20 ms: the all-reduce takes 8 of it, in every step but the last's tail.
    assert rows["MPI_ALLREDUCE"].share == pytest.approx(80.02 / (9 * 20 + 15.033), rel=1e-3)
    assert [row.name for row in summarize(_timeline(), 0.0)][:2] == ["NEGOTIATE_ALLREDUCE",
                                                                    "ALLREDUCE"]


def test_messages_that_follow_each_other_are_counted_apart() -> None:
    found = [s for s in spans(_timeline(steps=2)) if s.name == "MPI_ALLREDUCE"]
    assert len(found) == 6
    assert [m.start_us for m in messages(found)["MPI_ALLREDUCE"]] == [6011, 26011]


def test_the_skipped_start_up_is_left_out() -> None:
    # A slow first step (start-up) moves the mean unless skipped.
    events = _timeline(steps=10)
    events += [{"ph": "B", "name": "MPI_ALLREDUCE", "ts": -50000, "pid": 1},
               {"ph": "E", "ts": -10000, "pid": 1}]
    whole = {row.name: row for row in summarize(events, skip=0.0)}["MPI_ALLREDUCE"]
    later = {row.name: row for row in summarize(events, skip=0.2)}["MPI_ALLREDUCE"]
    assert whole.messages == 11 and whole.mean_ms > 10
    assert later.messages < 11 and later.mean_ms == pytest.approx(8.002)
    with pytest.raises(ValueError, match=r"skip=1: expected a fraction"):
        summarize(events, skip=1)


def test_an_unterminated_file_is_read_and_an_unfinished_activity_left_out(
        tmp_path: Path) -> None:
    events = _timeline(steps=3)
    events.append({"ph": "B", "name": "MPI_ALLREDUCE", "ts": 90000, "pid": 1})  # killed here
    path = tmp_path / TIMELINE_FILE
    path.write_text("[\n" + ",\n".join(json.dumps(e) for e in events) + ",")
    loaded = load(path)
    assert len(loaded) == len(events)
    assert {row.name: row for row in summarize(loaded, 0.0)}["MPI_ALLREDUCE"].messages == 3


def test_the_command_prints_the_table_for_a_model_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / TIMELINE_FILE).write_text(json.dumps(_timeline()))
    assert cli.main([str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "| MPI_ALLREDUCE | 9 | 8.00 | 8.00 |" in out, out  # --skip 0.1 leaves the first out
    assert out.index("NEGOTIATE_ALLREDUCE") < out.index("MEMCPY_IN_FUSION_BUFFER"), out


def test_the_command_names_the_file_it_could_not_read(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main([str(tmp_path)]) == 1
    assert f"{tmp_path / TIMELINE_FILE}: no Horovod timeline there; train with " \
           "--horovod_timeline" in capsys.readouterr().err
    bad = tmp_path / "broken.json"
    bad.write_text('{"not": "a list"}')
    assert cli.main([str(bad)]) == 1
    assert f"{bad}: not a Horovod timeline: expected a JSON list" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main([str(bad), "--skip=1.5"])
    assert "--skip=1.5: expected a fraction" in capsys.readouterr().err
