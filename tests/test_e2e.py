"""``python -m tfscale.train`` end to end as a subprocess: results, checkpoints, resume."""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np
import pytest

from tests.conftest import TINY, read_results, run_train
from tfscale.training.checkpointing import CheckpointManager

REQUIRED = {"model", "strategy", "num_workers", "global_batch_size", "steps", "images_per_sec",
            "images_per_sec_per_worker", "step_time_ms", "final_loss", "config"}


def test_default_strategy_writes_everything(tmp_path: Path) -> None:
    proc = run_train(*TINY, "--steps=6", "--epochs=2", "--tensorboard=true",
                     f"--model_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "== tfscale summary ==" in proc.stdout
    assert "--model=tiny_cnn on --dataset=synthetic; " in proc.stdout
    # The run saved its configuration and let go of the model_dir.
    assert json.loads((tmp_path / "config.json").read_text())["learning_rate"] == 0.1
    assert not (tmp_path / "run.lock").exists()
    # Resuming with other training flags stops before TensorFlow loads, listing them.
    changed = run_train(*TINY, "--steps=6", "--epochs=2", "--learning_rate=0.01",
                        "--optimizer=nesterov", f"--model_dir={tmp_path}")
    assert changed.returncode == 2, changed.stdout + changed.stderr
    assert ("another configuration (--optimizer 'sgd' -> 'nesterov', --learning_rate 0.1 -> "
            "0.01)") in changed.stderr
    results = read_results(tmp_path)
    assert REQUIRED <= results.keys()
    assert results["model"] == "tiny_cnn" and results["strategy"] == "default"
    assert results["steps"] == 6 and results["global_batch_size"] == 4
    assert results["images_per_sec"] > 0 and np.isfinite(results["final_loss"])
    assert results["config"]["batch_size"] == 4
    assert "accuracy" in results["metrics"]
    assert CheckpointManager(tmp_path / "checkpoints").steps() == [6, 3]
    assert list((tmp_path / "tensorboard").rglob("events.out.tfevents*"))
    # Per-step scalars every --log_every (1) steps beside Keras' epoch scalars; progress lines
    # with the ETAs and the compiled first step once.
    assert step_scalars(tmp_path / "tensorboard" / "steps") == {
        "step/loss": list(range(1, 7)), "step/learning_rate": list(range(1, 7)),
        "step/images_per_sec": [2, 3, 4, 5, 6], "step/step_time_ms": [2, 3, 4, 5, 6]}
    assert proc.stdout.count("first step compiled in") == 1
    assert "step 6/6  loss " in proc.stdout and "ETA 0:00:00  |  epoch 2 3/3  " in proc.stdout
    model = keras.models.load_model(tmp_path / "model.keras")
    assert model.output_shape == (None, 4)


def step_scalars(directory: Path) -> dict[str, list[int]]:
    """The steps of each scalar tag in ``directory``'s event files."""
    import tensorflow as tf

    steps: dict[str, list[int]] = {}
    for path in sorted(directory.glob("events.out.tfevents*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                steps.setdefault(value.tag, []).append(event.step)
    return steps


@pytest.mark.slow
def test_resume_continues_from_checkpoint(tmp_path: Path) -> None:
    """4 + 4 steps end with the checkpoint of 8 in one run, batch-norm statistics included:
    the first run ends with statistics recomputed at step 4, from which the moving averages of
    steps 5-8 then start, and each run ends by recomputing them from the same weights over the
    same first training batches (without that, the two would differ)."""
    flags = [*TINY, "--model=tiny_bn_cnn", "--bn_statistics=precise",
             "--bn_statistics_images=8", "--epochs=2", "--checkpoint_every=2", "--deterministic"]
    stopped, full = tmp_path / "stopped", tmp_path / "full"
    assert run_train(*flags, "--steps=4", f"--model_dir={stopped}").returncode == 0
    first = CheckpointManager(stopped / "checkpoints").read(4)[1]
    proc = run_train(*flags, "--steps=8", f"--model_dir={stopped}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "steps 4->8" in proc.stdout
    results = read_results(stopped)
    assert results["steps"] == 8 and results["steps_this_run"] == 4
    assert run_train(*flags, "--steps=8", f"--model_dir={full}").returncode == 0
    assert "step 8: batch-norm statistics recomputed over 8 training images" in proc.stdout
    meta, resumed = CheckpointManager(stopped / "checkpoints").read(8)
    uninterrupted = CheckpointManager(full / "checkpoints").read(8)[1]
    assert any("moving_variance" in path for path in meta["paths"])
    assert any(np.any(a != b) for a, b in zip(first, resumed, strict=True))
    for a, b in zip(resumed, uninterrupted, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    again = run_train(*flags, "--steps=8", f"--model_dir={stopped}")
    assert again.returncode == 0 and "already trained to step 8" in again.stdout
    # Another global batch (2 micro-batches of 4): refused, with the --batch_size that keeps
    # it; allowed, the run goes on from the step of 8 at which as many images were trained.
    other = [*flags, "--steps=12", "--grad_accum_steps=2", f"--model_dir={stopped}"]
    refused = run_train(*other)
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert (f"{stopped}'s checkpoint of step 8 was trained at a global batch of 4; this run's "
            "would be 8 (4 per replica x 1 replicas x 2 micro-batches): give --batch_size=2 "
            "to keep it with these workers") in refused.stderr
    allowed = run_train(*other, "--allow_config_change")
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    assert "the global batch changes from 4 to 8: step 8 (32 images) goes on as step 4" in (
        allowed.stdout)
    assert "steps 4->12" in allowed.stdout and read_results(stopped)["steps"] == 12
    assert CheckpointManager(stopped / "checkpoints" / "global-batch-4").steps()[0] == 8
    assert CheckpointManager(stopped / "checkpoints").steps()[0] == 12
