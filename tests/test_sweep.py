"""The flag sweep on a tiny grid: table, plots, failures recorded, resume skips finished."""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY, requires_horovod, run_process
from tfscale.cli import sweep_report
from tfscale.cli.sweep import Point, outcome, parse_grid

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


def _rows() -> list[dict[str, object]]:
    """Two strategies on 1, 2 and 4 workers, the second's points on top of the first's."""
    rows: list[dict[str, object]] = []
    for strategy in ("ddl", "horovod"):
        for workers, rate in ((1, 3.0), (2, 5.4), (4, 9.6)):
            rows.append({"strategy": strategy, "num_processes": workers, "status": "ok",
                         "num_workers": workers, "images_per_sec": rate, "step_time_ms": 5000.0,
                         "images_per_sec_per_worker": rate / workers, "model": "resnet50",
                         "dataset": "synthetic", "device": "CPU: AMD EPYC, 2 cores",
                         "wall_s": 40.0})
    rows.append({"strategy": "horovod", "num_processes": 8, "status": "failed",
                 "exit_code": 2, "error": "error: --num_processes=8 is too many", "wall_s": 3.0})
    sweep_report.add_scaling_efficiency(rows, ["strategy", "num_processes"])
    return rows


def test_plots_integer_ticks_title_ideal_line_full_axis_and_legend_outside() -> None:
    figures = sweep_report.figures(_rows(), ["strategy", "num_processes"])
    throughput, scaling = (figures[n].axes[0] for n in ("throughput.png", "scaling.png"))
    for ax in (throughput, scaling):
        assert list(ax.get_xticks()) == [1, 2, 4]
        assert ax.get_title() == "resnet50 on synthetic (CPU: AMD EPYC, 2 cores)"
        assert ax.get_ylim()[0] == 0
        # The legend lies right of the axes, over none of the curves.
        figure = ax.figure
        figure.canvas.draw()
        legend = ax.get_legend().get_window_extent()
        assert legend.x0 > ax.get_window_extent().x1
        # The two strategies' identical curves differ in marker and dash pattern.
        curves = [ln for ln in ax.get_lines() if ln.get_label().startswith("strategy=")]
        assert len({(ln.get_marker(), ln.get_linestyle()) for ln in curves}) == 2
    assert scaling.get_ylim()[1] >= 1.0
    ideal = [ln for ln in throughput.get_lines() if list(ln.get_xdata()) == [1, 2, 4]
             and list(ln.get_ydata()) == [3.0, 6.0, 12.0]]
    assert len(ideal) == 2, "each strategy's ideal scaling from its 1-worker point"


def test_terminal_table_and_point_outcomes() -> None:
    rows = _rows()
    table = sweep_report.brief(rows, ["strategy", "num_processes"]).splitlines()
    assert table[0].split() == ["strategy", "num_processes", "images/s", "per", "worker",
                                "step", "ms", "efficiency", "wall", "s", "status"]
    assert table[3].split() == ["ddl", "4", "9.60", "2.40", "5000", "0.80", "40", "ok"]
    assert table[-1].split() == ["horovod", "8", "-", "-", "-", "-", "3", "failed", "(2)"]
    assert outcome(rows[1]) == ("ok in 40 s: 5.40 images/s on 2 worker(s), step 5000 ms, "
                                "weak-scaling efficiency 0.90")
    assert outcome(rows[-1]) == ("failed in 3 s, exit code 2: error: --num_processes=8 is too "
                                 "many")


@pytest.mark.slow
@requires_horovod
def test_sweep_runs_records_failures_and_resumes(tmp_path: Path) -> None:
    grid = ["--grid=num_processes=1,2", "--grid=batch_size=2,0"]
    command = [*SWEEP, f"--out={tmp_path}", *grid, "--", *TINY, "--strategy=horovod",
               "--steps=3"]
    first = run_process(command, timeout=400)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    assert "[sweep] 2/4 num_processes=1 batch_size=0: started" in first.stdout
    assert "[sweep] 2/4 num_processes=1 batch_size=0: failed in " in first.stdout
    assert "[sweep] 3/4 num_processes=2 batch_size=2: ok in " in first.stdout
    assert "num_processes  batch_size  images/s" in first.stdout
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
