"""Seeing inside a step: --profile_steps, --horovod_timeline, --horovod_autotune."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.conftest import TINY, read_results, requires_horovod, run_train
from tfscale.cli import plugins
from tfscale.config.train_config import TrainConfig
from tfscale.exchange.horovod_timeline import TIMELINE_FILE, load, summarize
from tfscale.strategies.ddl import DDLStrategy
from tfscale.strategies.horovod import HorovodStrategy


def test_profile_steps_are_first_and_last_step() -> None:
    assert TrainConfig(profile_steps="3:5").profile_range == (3, 5)
    assert TrainConfig(profile_steps="4").profile_range == (4, 4)
    assert TrainConfig().profile_range is None
    for bad in ("5:3", "0:2", "a:b", "3:"):
        with pytest.raises(ValueError, match=f"--profile_steps='{bad}': expected A:B"):
            TrainConfig(profile_steps=bad)
    with pytest.raises(ValueError, match=r"--profile_steps=8:12 ends after .*--steps=10"):
        TrainConfig(profile_steps="8:12", steps=10)


def test_timeline_and_autotune_become_horovod_variables() -> None:
    config = TrainConfig(strategy="horovod", model_dir="/runs/a", horovod_timeline=True,
                         horovod_autotune=True)
    for cls in (HorovodStrategy, DDLStrategy):
        env = cls.environment(config)
        assert env["HOROVOD_TIMELINE"] == "/runs/a/horovod_timeline.json"
        assert env["HOROVOD_AUTOTUNE"] == "1"
        assert env["HOROVOD_AUTOTUNE_LOG"] == "/runs/a/horovod_autotune.csv"
    assert "HOROVOD_TIMELINE" not in HorovodStrategy.environment(TrainConfig(strategy="horovod"))
    with pytest.warns(UserWarning, match="--horovod_timeline only affect"):
        plugins.validate_names(TrainConfig(strategy="default", horovod_timeline=True))


def test_the_timelines_folder_exists_before_horovod_starts_under_either_strategy(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Horovod opens the timeline in ``hvd.init()`` and, in a folder that does not exist, only
    warns: ddl starts Horovod itself, before the base class's setup, and so wrote no timeline
    into a new --model_dir (found by bench.shaped_links, 2026-12-04). Setting the variables
    creates the folder, under both strategies."""
    for cls in (HorovodStrategy, DDLStrategy):
        model_dir = tmp_path / cls.__name__ / "new"
        config = TrainConfig(strategy="horovod", model_dir=str(model_dir), horovod_timeline=True)
        # Set here so that the test's end restores them: apply_environment sets the process's.
        monkeypatch.setenv("HOROVOD_CYCLE_TIME", "5")
        monkeypatch.setenv("HOROVOD_TIMELINE", "")
        cls(config).apply_environment()
        assert model_dir.is_dir()
        assert os.environ["HOROVOD_TIMELINE"] == str(model_dir / TIMELINE_FILE)
    plain = tmp_path / "plain"
    HorovodStrategy(TrainConfig(strategy="horovod", model_dir=str(plain))).apply_environment()
    assert not plain.exists()


def test_profile_steps_write_a_trace_for_tensorboard(tmp_path: Path) -> None:
    proc = run_train(*TINY, "--steps=6", "--profile_steps=3:4", f"--model_dir={tmp_path}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    traces = list((tmp_path / "tensorboard" / "plugins" / "profile").glob("*/*.xplane.pb"))
    assert len(traces) == 1, traces
    assert traces[0].stat().st_size > 0


@requires_horovod
@pytest.mark.slow
def test_horovod_timeline_and_autotune_log_are_written(tmp_path: Path) -> None:
    proc = run_train(*TINY, "--strategy=horovod", "--num_processes=2", "--steps=30",
                     "--horovod_timeline", "--horovod_autotune", f"--model_dir={tmp_path}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert read_results(tmp_path)["steps"] == 30
    # On one node the gradients would take shared memory and leave Horovod nothing to record.
    assert "gradients inside a node: Horovod (Gloo)" in proc.stdout
    timeline = (tmp_path / TIMELINE_FILE).read_text()
    # Horovod writes a JSON array of trace events and may leave it unterminated: load reads it.
    events = load(tmp_path / TIMELINE_FILE)
    assert any("ALLREDUCE" in str(event.get("name", "")) for event in events), timeline[:500]
    # The summary of the same file (tfscale.cli.timeline): Gloo's all-reduces, in messages.
    rows = {row.name: row for row in summarize(events, skip=0.0)}
    assert rows["GLOO_ALLREDUCE"].messages >= 1 and rows["GLOO_ALLREDUCE"].median_ms > 0, rows
    assert (tmp_path / "horovod_autotune.csv").exists()
