"""Resuming with a changed configuration (tfscale/training/resume.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tfscale.config.train_config import TrainConfig
from tfscale.training.resume import check_resume, save


def _trained(model_dir: Path, saved_as: str = "config.json", **fields: object) -> None:
    config = TrainConfig(model="tiny_cnn", model_dir=str(model_dir), **fields)  # type: ignore[arg-type]
    if saved_as == "config.json":
        save(config)
    else:  # a run from before config.json: its config only in results.json
        (model_dir / "results.json").write_text(json.dumps({"config": config.to_dict()}))
    (model_dir / "checkpoints").mkdir()
    (model_dir / "checkpoints" / "ckpt-000000003.npz").write_bytes(b"")


@pytest.mark.parametrize("saved_as", ["config.json", "results.json"])
def test_resume_with_other_training_flags_stops(tmp_path: Path, saved_as: str) -> None:
    tmp_path.mkdir(exist_ok=True)
    _trained(tmp_path, saved_as)
    changed = TrainConfig(model="tiny_cnn", model_dir=str(tmp_path), learning_rate=0.01,
                          optimizer="nesterov", batch_size=8)
    # The batch per replica may change with the workers: the trainer checks the global batch.
    with pytest.raises(ValueError, match=rf"--model_dir={tmp_path} holds a checkpoint trained "
                                         r"with another configuration \("
                                         r"--optimizer 'sgd' -> 'nesterov', --learning_rate 0.1 "
                                         r"-> 0.01\); .*--allow_config_change"):
        check_resume(changed, print)
    logged: list[str] = []
    check_resume(changed.replace(allow_config_change=True), logged.append)
    assert [line.split(" with ")[1] for line in logged] == [
        "--optimizer changed from 'sgd' to 'nesterov'",
        "--learning_rate changed from 0.1 to 0.01"]


def test_what_may_change_between_attempts_passes(tmp_path: Path) -> None:
    _trained(tmp_path, steps=3)
    logged: list[str] = []
    # Longer, other logging and checkpoints, two horovod workers with their tuning flags.
    check_resume(TrainConfig(model="tiny_cnn", model_dir=str(tmp_path), steps=30, epochs=3,
                             log_every=1, checkpoint_every=5, strategy="horovod",
                             num_processes=2, cycle_time_ms=5.0, cpu_binding=True),
                 logged.append)
    assert logged == []
    # Nothing to resume: a new run starts whatever config.json says.
    (tmp_path / "checkpoints" / "ckpt-000000003.npz").unlink()
    check_resume(TrainConfig(model="tiny_cnn", model_dir=str(tmp_path), seed=3), print)


def test_the_default_model_dir_is_named_as_such(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    config = TrainConfig(model="tiny_cnn")
    Path(config.model_dir).mkdir(parents=True)
    _trained(Path(config.model_dir))
    with pytest.raises(ValueError, match="^--model_dir was not given, and its default "
                                         r"runs/tiny_cnn-synthetic-default holds a checkpoint .*"
                                         r"\(--seed 0 -> 1\)"):
        check_resume(config.replace(seed=1), print)
