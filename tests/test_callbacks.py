"""tfscale.callbacks in a user's own model.fit: unit behaviour and a real Horovod script."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import keras
import numpy as np
import pytest

from tests.conftest import ROOT, horovodrun, requires_horovod, run_process
from tests.equivalence import load_weights, max_abs_diff
from tfscale.callbacks import ChiefOnly, LearningRateWarmup
from tfscale.cluster import rank_zero


def _model(lr: float = 0.1) -> keras.Model:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(lr), loss="mse")
    return model


def test_warmup_ramps_linearly_to_target() -> None:
    warmup = LearningRateWarmup(target_lr=0.4, warmup_steps=4, num_workers=4)
    assert [warmup.rate(s) for s in range(6)] == pytest.approx([0.1, 0.175, 0.25, 0.325, 0.4,
                                                                0.4])
    model = _model()
    seen: list[float] = []
    record = keras.callbacks.LambdaCallback(
        on_train_batch_begin=lambda b, logs: seen.append(float(model.optimizer.learning_rate)))
    model.fit(np.ones((6, 3)), np.ones((6, 2)), batch_size=1, epochs=1, verbose=0,
              callbacks=[warmup, record])
    assert seen == pytest.approx([0.1, 0.175, 0.25, 0.325, 0.4, 0.4])
    with pytest.raises(ValueError, match="all must be > 0"):
        LearningRateWarmup(0.1, warmup_steps=0)


def test_warmup_refuses_a_schedule() -> None:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)
    model.compile(optimizer=keras.optimizers.SGD(schedule), loss="mse")
    with pytest.raises(ValueError, match="has a schedule"):
        model.fit(np.ones((2, 3)), np.ones((2, 2)), verbose=0,
                  callbacks=[LearningRateWarmup(0.1, 2)])


def test_chief_only_forwards_on_chief_and_not_elsewhere(tmp_path: Path) -> None:
    log = tmp_path / "log.csv"
    try:
        rank_zero.set_rank(1)
        _model().fit(np.ones((2, 3)), np.ones((2, 2)), verbose=0,
                     callbacks=[ChiefOnly(keras.callbacks.CSVLogger(str(log)))])
        assert not log.exists()
        rank_zero.set_rank(0)
        _model().fit(np.ones((2, 3)), np.ones((2, 2)), epochs=2, verbose=0,
                     callbacks=[ChiefOnly(keras.callbacks.CSVLogger(str(log)))])
        assert len(log.read_text().splitlines()) == 3
    finally:
        rank_zero.set_rank(0)


def test_launcher_rank_from_environment() -> None:
    assert rank_zero.launcher_rank({
        "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
        "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}) == 3
    tf_config = json.dumps({"cluster": {"worker": ["a:1", "b:1", "c:1"]},
                            "task": {"type": "worker", "index": 2}})
    assert rank_zero.launcher_rank({"TF_CONFIG": tf_config}) == 2
    assert rank_zero.launcher_rank({}) == 0


@pytest.mark.slow
@requires_horovod
def test_user_script_with_horovod_keeps_workers_identical(tmp_path: Path) -> None:
    proc = run_process([horovodrun(), "--gloo", "-np", "2", "-H", "localhost:2",
                        sys.executable, "examples/horovod_fit.py", f"--out={tmp_path}"],
                       env={"PYTHONPATH": str(ROOT)}, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "workers 2" in proc.stdout
    w0, w1 = load_weights(tmp_path / "weights_rank0.npz"), load_weights(
        tmp_path / "weights_rank1.npz")
    assert max_abs_diff(w0, w1) == 0.0
    assert keras.models.load_model(tmp_path / "model.keras").count_params() == sum(
        int(np.prod(w.shape)) for w in w0)
    assert len(list((tmp_path / "tensorboard").rglob("events.out.tfevents*"))) >= 1


class _CountingSummary:
    """tf.summary, counting the scalars asked of it."""

    def __init__(self) -> None:
        import tensorflow as tf

        self.real, self.names = tf.summary, []

    def scalar(self, name: str, *args: object, **kwargs: object) -> object:
        self.names.append(name)
        return self.real.scalar(name, *args, **kwargs)

    def __getattr__(self, name: str) -> object:
        return getattr(self.real, name)


@pytest.mark.parametrize("update_freq", ["epoch", 2])
def test_epoch_tensorboard_skips_batch_scalars_only_when_writing_per_epoch(
        update_freq: str | int, tmp_path: Path) -> None:
    from tfscale.callbacks import EpochTensorBoard

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile("sgd", "mse")
    board = EpochTensorBoard(str(tmp_path), update_freq=update_freq, write_graph=False)
    counting = _CountingSummary()
    board._summary_module = counting
    model.fit(np.ones((8, 3)), np.ones((8, 1)), batch_size=2, epochs=2, verbose=0,
              callbacks=[board])
    batch = [n for n in counting.names if n.startswith("batch_")]
    # Keras' own callback asks 2 epochs x 4 batches x the loss, recorded or not.
    assert len(batch) == (0 if update_freq == "epoch" else 8), counting.names
    assert "epoch_loss" in counting.names
    assert list((tmp_path / "train").glob("events.out.tfevents.*"))
