"""bench.overhead --side_by_side: each run's rate over the window in which both were timed."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.overhead import _stamp_steps, common_window


def _every(seconds: float, first_end: float, steps: int) -> list[tuple[int, float]]:
    return [(step, first_end + (step - 1) * seconds) for step in range(1, steps + 1)]


def test_each_run_is_timed_over_its_whole_steps_inside_the_common_window() -> None:
    # plain ends step 1 at 20 s and then takes 10 s a step to 90; tfscale ends step 1 at 33
    # and takes 11 s a step, but only 5 s a step after 90, once it runs alone.
    tfscale = _every(11.0, 33.0, 6) + [(7, 93.0), (8, 98.0)]
    rates = common_window({"plain keras": _every(10.0, 20.0, 8), "tfscale.train": tfscale},
                          batch=32)
    # Steady from step 2's end: the window is 44..90. plain's ends 50..90 (4 steps in 40 s),
    # tfscale's 44..88 (4 in 44).
    assert rates["plain keras"] == {"window_images_per_sec": 3.2, "window_steps": 4,
                                    "window_s": 46.0}
    assert rates["tfscale.train"] == {"window_images_per_sec": round(32 * 4 / 44, 3),
                                      "window_steps": 4, "window_s": 46.0}
    # Over their own timed steps the later run would have looked faster than it was beside
    # the other: 7 steps in 65 s against 4 in 44.
    assert 32 * 7 / (98.0 - 33.0) > rates["tfscale.train"]["window_images_per_sec"]


def test_the_slow_first_timed_step_is_left_out_of_both_runs_not_one() -> None:
    # Both programs: step 2 takes 16 s, the steps after it 10 s; tfscale starts 20 s sooner.
    def run(first_end: float) -> list[tuple[int, float]]:
        return [(1, first_end)] + [(step, first_end + 6.0 + 10.0 * (step - 1))
                                   for step in range(2, 12)]

    ends = {"plain keras": run(40.0), "tfscale.train": run(20.0)}
    rates = common_window(ends, batch=32)
    assert rates["plain keras"]["window_images_per_sec"] == 3.2
    assert rates["tfscale.train"]["window_images_per_sec"] == 3.2
    # A window from the later step 1's end holds plain's slow step and none of tfscale's.
    unfair = common_window(ends, batch=32, warmup=0)
    assert unfair["tfscale.train"]["window_images_per_sec"] == 3.2
    assert unfair["plain keras"]["window_images_per_sec"] < 3.1


def test_a_run_without_step_one_or_a_window_too_short_is_refused() -> None:
    with pytest.raises(ValueError, match="tfscale.train: no line for step 1"):
        common_window({"plain keras": _every(10.0, 20.0, 4),
                       "tfscale.train": _every(10.0, 30.0, 4)[1:]}, batch=32)
    # tfscale's steady steps start when plain's last step ends.
    with pytest.raises(ValueError, match="more --steps"):
        common_window({"plain keras": _every(10.0, 20.0, 4),
                       "tfscale.train": _every(10.0, 40.0, 4)}, batch=32)


def test_step_lines_are_stamped_as_they_come_and_the_output_kept(tmp_path: Path) -> None:
    script = ("import time\nprint('step 1/2  loss 1.0', flush=True)\nprint('other', flush=True)\n"
              "time.sleep(0.3)\nprint('step 2/2  loss 0.9', flush=True)\nprint('not step 3/2')")
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE)
    ends: list[tuple[int, float]] = []
    assert proc.stdout is not None
    _stamp_steps(proc.stdout, tmp_path / "out", ends)
    assert proc.wait(timeout=60) == 0
    assert [step for step, _ in ends] == [1, 2]
    assert ends[1][1] - ends[0][1] >= 0.25  # stamped on arrival, not when the pipe closed
    assert (tmp_path / "out").read_text().splitlines() == [
        "step 1/2  loss 1.0", "other", "step 2/2  loss 0.9", "not step 3/2"]
