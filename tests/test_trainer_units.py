"""Pure pieces of the trainer and results: step planning, summary, atomic JSON."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tfscale.results import summary, write_json_atomic
from tfscale.trainer import Segment, plan_segments


@pytest.mark.parametrize(
    ("start", "total", "spe", "expected"),
    [
        (0, 10, 5, [Segment(0, 2, 5, 0)]),
        (0, 10, 4, [Segment(0, 2, 4, 0), Segment(2, 3, 2, 8)]),
        (3, 10, 5, [Segment(0, 1, 2, 3), Segment(1, 2, 5, 5)]),
        (7, 10, 5, [Segment(1, 2, 3, 7)]),
        (10, 10, 5, []),
        (2, 9, 3, [Segment(0, 1, 1, 2), Segment(1, 3, 3, 3)]),
    ],
)
def test_plan_segments(start: int, total: int, spe: int, expected: list[Segment]) -> None:
    segments = plan_segments(start, total, spe)
    assert segments == expected
    covered = sum((s.epochs - s.initial_epoch) * s.steps_per_epoch for s in segments)
    assert covered == total - start


def test_results_json_is_atomic_and_summary_has_figures(tmp_path: Path) -> None:
    results = {"model": "m", "strategy": "horovod", "num_workers": 2, "replicas_per_worker": 1,
               "global_batch_size": 64, "steps": 10, "steps_this_run": 10,
               "images_per_sec": 12.5, "images_per_sec_per_worker": 6.25,
               "step_time_ms": 5120.0, "final_loss": 6.9, "metrics": {"accuracy": 0.5}}
    path = tmp_path / "sub" / "results.json"
    write_json_atomic(path, results)
    assert json.loads(path.read_text()) == results
    assert [p.name for p in path.parent.iterdir()] == ["results.json"]
    text = summary(results)
    for fragment in ("horovod", "2 x 1", "64", "12.50", "6.25", "5120.0 ms", "6.9000",
                     "accuracy"):
        assert fragment in text
