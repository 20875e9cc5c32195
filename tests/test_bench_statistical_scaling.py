"""bench.statistical_scaling's pure parts: the flags of a run, the plan, the target, the summary,
where perfect scaling ends and the forecast's statistical-efficiency file (no training)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from bench.statistical_scaling import (
    ARMS,
    EFFICIENCY_ARM,
    budget_steps,
    efficiency_file,
    parse_targets,
    perfect_scaling_end,
    pick_target,
    plan,
    run_flags,
    summarize,
)
from tfscale.forecast.efficiency import parse


def flags_of(arm: str, batch: int) -> dict[str, str]:
    flags = run_flags(ARMS[arm], 8, 1438, batch, 3, Path("/data"))
    return dict(f[2:].partition("=")[::2] for f in flags)


def test_every_batch_sees_the_same_images_and_warms_up_over_the_same_fraction() -> None:
    assert [budget_steps(8, 1438, b) for b in (16, 64, 256)] == [719, 180, 45]
    small, large = flags_of("linear", 16), flags_of("linear", 256)
    assert (small["grad_accum_steps"], large["grad_accum_steps"]) == ("1", "16")
    assert small["batch_size"] == large["batch_size"] == "16"
    assert (small["warmup_steps"], large["warmup_steps"]) == ("82", "5")
    assert small["epochs"] == large["epochs"] == "16"  # 16 evaluations


def test_the_learning_rate_per_global_batch() -> None:
    # Linear scaling: 0.0125 per 16 images, scaled by the framework under accumulation...
    assert flags_of("linear", 256)["learning_rate"] == "0.0125"
    assert flags_of("linear", 256)["lr_scaling"] == "linear"
    # ...and given scaled to one process at the whole batch, where the framework has no factor.
    assert flags_of("ema one process", 256)["learning_rate"] == "0.2"
    assert "lr_scaling" not in flags_of("ema one process", 256)
    constant = flags_of("constant", 256)
    assert constant["learning_rate"] == "0.05" and "warmup_steps" not in constant


def test_real_workers_run_the_issues_command() -> None:
    flags = flags_of("horovod x4", 64)
    assert (flags["num_processes"], flags["batch_size"], flags["epochs"]) == ("4", "16", "8")
    assert (flags["learning_rate"], flags["warmup_steps"]) == ("0.05", "20")
    assert "bn_statistics" not in flags and "steps" not in flags


def test_plan_runs_the_first_arms_first_with_seeds_outermost_and_can_be_narrowed() -> None:
    runs = plan(["digits"], ["constant", "linear"], None, None)
    assert runs[0] == ("digits", "linear", 16, 0)
    linear = [s for _, arm, _, s in runs if arm == "linear"]
    assert runs[:len(linear)] == [r for r in runs if r[1] == "linear"]
    assert linear == sorted(linear) and set(linear) == {0, 1, 2}
    assert ("digits", "constant", 16, 2) not in runs  # constant has two seeds
    assert plan(["digits"], ["linear"], [1], [32]) == [("digits", "linear", 32, 1)]
    assert plan(["textures"], ["multiworker x4"], None, None) == []


def run(arm: str, batch: int, accuracies: list[float], steps: int = 100) -> dict[str, Any]:
    history = [{"step": steps * (i + 1) // len(accuracies), "val_accuracy": a,
                "epochs": 8 * (i + 1) / len(accuracies)} for i, a in enumerate(accuracies)]
    return {"arm": arm, "global_batch": batch, "steps": steps, "final": accuracies[-1],
            "train_examples": 1438,
            "history": history, "wall_seconds": 10.0}


def test_target_summary_and_efficiency_file() -> None:
    runs = [run("linear", 16, [0.5, 0.9, 0.96]), run("linear", 16, [0.5, 0.8, 0.98]),
            run("linear", 64, [0.2, 0.4, 0.6])]
    assert pick_target(runs) == pytest.approx(0.95)  # best mean 0.97, 2 points below
    assert pick_target([*runs, run("horovod x2", 64, [0.99])]) == pytest.approx(0.95)
    assert pick_target([*runs, run("zero-init residual", 64, [0.99])]) == pytest.approx(0.95)
    row = summarize(runs[:2], 0.95)
    assert row["reached"] == "2/2" and row["final acc (mean)"] == pytest.approx(0.97)
    assert row["epochs to target"] == pytest.approx(8.0)
    data = efficiency_file("digits", runs, 0.9, "bench.statistical_scaling, today, CPU", "linear")
    assert efficiency_file("digits", runs, 0.9, "x")["points"] == []  # not EFFICIENCY_ARM's runs
    assert data["target"] == {"metric": "val_accuracy", "value": 0.9}
    assert (data["per_worker_batch"], data["train_images"]) == (16, 1438)
    assert data["points"] == [
        {"global_batch": 16, "epochs_to_target": pytest.approx(6.667, abs=1e-3),
         "steps_to_target": 83, "seeds": 2, "reached": 2},
        {"global_batch": 64, "epochs_to_target": None, "steps_to_target": None, "seeds": 1,
         "reached": 0}]
    curve = parse(json.loads(json.dumps(data)), Path("efficiency_digits.json"))  # the forecast's
    assert curve.epochs(16) == pytest.approx(6.667) and curve.epochs(64) is None
    assert curve.train_images == 1438


def test_perfect_scaling_ends_where_steps_fall_short_of_the_line() -> None:
    assert perfect_scaling_end([(16, 800), (32, 400), (64, 220), (128, 150), (256, 140)]) == 64
    assert perfect_scaling_end([(16, 800), (32, 400), (64, None), (128, 100)]) == 32
    assert perfect_scaling_end([(16, None), (32, 400)]) is None


def test_targets_on_the_command_line() -> None:
    assert parse_targets("digits=0.95,textures=0.7") == {"digits": 0.95, "textures": 0.7}
    assert parse_targets("") == {}


@pytest.mark.parametrize("dataset", ["digits", "textures"])
def test_shipped_efficiency_files_are_the_kept_runs_of_today_s_defaults(dataset: str) -> None:
    """The forecast's shipped files remade from the kept raw result (docs/statistical_scaling)
    give the same points: the data, the docs' tables and the files cannot drift apart."""
    root = Path(__file__).resolve().parents[1]
    kept = json.loads((root / "docs" / "statistical_scaling" / "statistical_scaling.json")
                      .read_text())
    shipped = json.loads((root / "tfscale" / "forecast" / "data" / f"efficiency_{dataset}.json")
                         .read_text())
    runs = [r for r in kept["runs"] if r["dataset"] == dataset]
    remade = efficiency_file(dataset, runs, kept["targets"][dataset], "kept")
    assert shipped["points"] == remade["points"]
    assert shipped["target"] == remade["target"] == {"metric": "val_accuracy",
                                                     "value": kept["targets"][dataset]}
    assert f"'{EFFICIENCY_ARM}' arm" in shipped["source"]
    # Today's defaults reach the target at every batch and seed on both datasets.
    assert all(p["reached"] == p["seeds"] == 3 for p in shipped["points"])
