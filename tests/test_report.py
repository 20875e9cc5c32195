"""The converters' and stats tool's progress line, on a clock the test sets."""

from __future__ import annotations

import io

import pytest

from input_pipelines.core import report


def test_rates_and_eta_leave_the_start_up_out(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [0.0]
    monkeypatch.setattr(report.time, "monotonic", lambda: now[0])
    out = io.StringIO()
    progress = report.Progress("stats", 10, 0, stream=out, unit="images")
    now[0] = 2.0
    progress.advance()  # within the first 5 s: no line yet
    assert out.getvalue() == ""
    now[0] = 20.0  # the pool's start-up and the first image took 20 s: no rate to extrapolate
    progress.advance(items=1)
    assert out.getvalue() == "stats: 1/10 images, 0.1 images/s, ETA ?\n"
    now[0] = 22.0
    progress.advance(items=2)  # 2 images in the 2 s after the first
    assert progress.line() == "stats: 3/10 images, 1.0 images/s, ETA 0:00:07"
    now[0] = 29.0
    progress.advance(items=7)
    progress.done()
    assert out.getvalue().splitlines()[1:] == [
        "stats: 10/10 images, 1.0 images/s, 0:00:29 elapsed"]


def test_files_with_samples_inside() -> None:
    progress = report.Progress("stats", 3, 3 * 2**20, stream=io.StringIO(), inside="samples")
    progress.advance(2**20, items=1, contents=40)
    assert progress.line().startswith("stats: 1/3 files, 40 samples (")
    assert "1.0/3.0 MiB" in progress.line()
