"""The flag sweep on a tiny grid: table, plots, failures recorded, resume skips finished."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY, requires_horovod, run_process
from tfscale.sweep import Point, parse_grid

SWEEP = [sys.executable, "-m", "tfscale.sweep"]


def test_parse_grid_cross_product_and_errors() -> None:
    points = parse_grid(["batch_size=2,4", "strategy=default,horovod"])
    assert [p.flags() for p in points] == [
        ["--batch_size=2", "--strategy=default"], ["--batch_size=2", "--strategy=horovod"],
        ["--batch_size=4", "--strategy=default"], ["--batch_size=4", "--strategy=horovod"]]
    assert Point((("lr", "0.1/2"),)).name == "lr-0.1-2"
    with pytest.raises(ValueError, match="no flag --batchsize"):
        parse_grid(["batchsize=2"])
    with pytest.raises(ValueError, match="expected NAME=V1,V2"):
        parse_grid(["batch_size"])
    with pytest.raises(ValueError, match="given twice"):
        parse_grid(["steps=1", "steps=2"])


@pytest.mark.slow
@requires_horovod
def test_sweep_runs_records_failures_and_resumes(tmp_path: Path) -> None:
    grid = ["--grid=num_processes=1,2", "--grid=batch_size=2,0"]
    command = [*SWEEP, f"--out={tmp_path}", *grid, "--", *TINY, "--strategy=horovod",
               "--steps=3"]
    first = run_process(command, timeout=400)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    rows = json.loads((tmp_path / "sweep.json").read_text())
    assert [r["status"] for r in rows] == ["ok", "failed", "ok", "failed"]
    assert "--batch_size=0 is not valid" in rows[1]["error"]
    ok = [r for r in rows if r["status"] == "ok"]
    assert [r["num_workers"] for r in ok] == [1, 2]
    assert ok[0]["scaling_efficiency"] == 1.0 and ok[1]["scaling_efficiency"] > 0
    with open(tmp_path / "sweep.csv") as f:
        assert len(list(csv.DictReader(f))) == 4
    assert "| num_processes | batch_size |" in (tmp_path / "sweep.md").read_text()
    for png in ("throughput.png", "scaling.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    finished = tmp_path / "points" / "num_processes-2_batch_size-2" / "results.json"
    stamp = finished.stat().st_mtime_ns
    again = run_process(command, timeout=400)
    assert again.returncode == 0
    assert finished.stat().st_mtime_ns == stamp, "a finished point was run again"
    assert json.loads((tmp_path / "sweep.json").read_text())[2]["images_per_sec"] == pytest.approx(
        rows[2]["images_per_sec"])
