"""``tfscale.horovod``: Horovod's Keras API on Keras 3.

In-process: the learning-rate callbacks' arithmetic (Horovod's formulas, momentum
correction) and the install hint. With real processes under ``horovodrun --gloo -np 2``: a
Horovod-style script trains to identical weights with a falling, averaged loss, saves a model
plain Keras loads, and gradient accumulation equals one step on all the data.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

from tests.conftest import horovodrun, requires_horovod, run_process
from tests.equivalence import load_weights, max_abs_diff
from tests.workers.hvd_keras_fit import ACCUMULATE_BATCH, accumulation_data, dense_model
from tfscale.exchange import horovod_runtime as runtime
from tfscale.horovod import callbacks as hvd_callbacks

WORKER = [sys.executable, "-m", "tests.workers.hvd_keras_fit"]


# --- in-process -------------------------------------------------------------------------------

class RecordRate(keras.callbacks.Callback):
    """Records the learning rate each batch trains with (after earlier callbacks set it)."""

    def __init__(self) -> None:
        super().__init__()
        self.rates: list[float] = []

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.rates.append(float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate)))


def _fit(callback: keras.callbacks.Callback, optimizer: keras.optimizers.Optimizer,
         epochs: int, steps: int) -> tuple[RecordRate, keras.callbacks.History]:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse")
    record = RecordRate()
    x = np.ones((steps * 2, 3), "float32")
    history = model.fit(x, x[:, :1], batch_size=2, epochs=epochs, verbose=0,
                        callbacks=[callback, record])
    return record, history


def test_warmup_follows_horovods_formula_from_single_worker_rate(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(runtime, "size", lambda: 4)
    warmup = hvd_callbacks.LearningRateWarmupCallback(initial_lr=0.4, warmup_epochs=2)
    record, history = _fit(warmup, keras.optimizers.SGD(0.4), epochs=3, steps=5)
    # lr(epoch) = lr/size * (1 + epoch*(size-1)/warmup), epoch = e + (b+1)/steps_per_epoch.
    expected = [0.1 * (1 + (e + (b + 1) / 5) * 3 / 2) for e in range(2) for b in range(5)]
    np.testing.assert_allclose(record.rates[:10], expected, rtol=1e-6)
    assert record.rates[9] == pytest.approx(0.4) and record.rates[10:] == [pytest.approx(0.4)] * 5
    np.testing.assert_allclose(history.history["lr"], [expected[4], 0.4, 0.4], rtol=1e-6)


def test_warmup_in_steps_with_fractional_epochs(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(runtime, "size", lambda: 2)
    warmup = hvd_callbacks.LearningRateWarmupCallback(initial_lr=0.2, warmup_epochs=0.5,
                                                      steps_per_epoch=4)
    record, _ = _fit(warmup, keras.optimizers.SGD(0.2), epochs=1, steps=4)
    np.testing.assert_allclose(record.rates, [0.15, 0.2, 0.2, 0.2], rtol=1e-6)


def test_schedule_staircase_initial_lr_from_optimizer_and_momentum_correction() -> None:
    schedule = hvd_callbacks.LearningRateScheduleCallback(initial_lr=None, multiplier=0.5,
                                                          start_epoch=1, end_epoch=3)
    optimizer = keras.optimizers.SGD(0.8, momentum=0.9)
    record, _ = _fit(schedule, optimizer, epochs=4, steps=2)
    np.testing.assert_allclose(record.rates, [0.8, 0.8, 0.8, 0.8, 0.4, 0.4, 0.4, 0.4],
                               rtol=1e-6)
    # Momentum correction: halving the rate halves SGD's velocity for that step.
    velocity = optimizer.momentums[0]
    before = np.asarray(velocity).copy()
    schedule.set_learning_rate(0.2)
    np.testing.assert_allclose(np.asarray(velocity), before * 0.5, rtol=1e-6)


def test_schedule_refuses_an_optimizer_with_a_schedule() -> None:
    callback = hvd_callbacks.LearningRateScheduleCallback(initial_lr=0.1, multiplier=0.5)
    decay = keras.optimizers.schedules.ExponentialDecay(0.1, 10, 0.9)
    with pytest.raises(ValueError, match="optimizer has a schedule"):
        _fit(callback, keras.optimizers.SGD(decay), epochs=1, steps=1)


def test_missing_horovod_says_how_to_install(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setitem(sys.modules, "horovod.tensorflow", None)
    with pytest.raises(RuntimeError, match="launch/setup.sh"):
        runtime.import_horovod()
    import tfscale.horovod as hvd

    with pytest.raises(RuntimeError, match="Horovod is not importable"):
        hvd.rank()


@requires_horovod
def test_load_model_wraps_the_saved_optimizer_and_options_are_validated(tmp_path: Path) -> None:
    import tfscale.horovod as hvd

    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mse")
    model.fit(np.ones((4, 3)), np.ones((4, 2)), verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = hvd.load_model(str(tmp_path / "m.keras"))
    assert isinstance(loaded.optimizer, keras.optimizers.Adam)
    assert type(loaded.optimizer).__module__ == keras.optimizers.Adam.__module__
    assert int(loaded.optimizer.iterations.numpy()) == 1
    with pytest.raises(ValueError, match="already reduces"):
        hvd.DistributedOptimizer(loaded.optimizer)
    with pytest.raises(ValueError, match="supports Average and Sum"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(), op=hvd.Max)
    with pytest.raises(ValueError, match="backward_passes_per_step=0"):
        hvd.DistributedOptimizer(keras.optimizers.SGD(), backward_passes_per_step=0)


# --- under horovodrun -------------------------------------------------------------------------

def _horovod(out: Path, *flags: str, env: dict[str, str] | None = None
             ) -> list[dict[str, Any]]:
    proc = run_process([horovodrun(), "--gloo", "-np", "2", "-H", "localhost:2", *WORKER,
                        f"--out={out}", *flags], timeout=120, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]


@requires_horovod
@pytest.mark.slow
@pytest.mark.parametrize("loss_scale", [False, True], ids=["adam-fp16-allreduce", "loss-scale"])
def test_horovod_style_script_trains_identically_and_saves_plain_keras(
        loss_scale: bool, tmp_path: Path) -> None:
    logs = _horovod(tmp_path, *(["--loss_scale"] if loss_scale else []))
    weights = [load_weights(tmp_path / f"rank{r}.npz") for r in range(2)]
    assert max_abs_diff(weights[0], weights[1]) == 0.0
    losses = logs[0]["history"]["loss"]
    assert losses[-1] < 0.7 * losses[0], losses
    # MetricAverageCallback: both workers log the job-wide average.
    assert logs[0]["history"] == logs[1]["history"]
    np.testing.assert_allclose(logs[0]["history"]["lr"], [0.004] * 3, rtol=1e-6)
    assert [log["allreduce"] for log in logs] == [3.0, 3.0]
    assert [log["allgather"] for log in logs] == [[0, 1], [0, 1]]
    assert [log["broadcast"] for log in logs] == [6.0, 6.0]
    assert (tmp_path / "best.keras").exists()
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert max_abs_diff([np.asarray(v) for v in loaded.trainable_weights], weights[0]) == 0.0
    optimizer = loaded.optimizer
    if loss_scale:
        assert type(optimizer) is keras.optimizers.LossScaleOptimizer
        optimizer = optimizer.inner_optimizer
    assert type(optimizer) is keras.optimizers.Adam
    assert int(loaded.optimizer.iterations.numpy()) == logs[0]["iterations"] == 30


@requires_horovod
@pytest.mark.slow
@pytest.mark.parametrize("exchange", ["shared_memory", "collectives"])
def test_backward_passes_accumulate_locally_and_equal_one_step_on_all_data(
        exchange: str, tmp_path: Path) -> None:
    passes = 2
    logs = _horovod(tmp_path, "--mode=accumulate", f"--passes={passes}",
                    env={"TFSCALE_NODE_EXCHANGE": exchange})
    weights = [load_weights(tmp_path / f"rank{r}.npz") for r in range(2)]
    assert max_abs_diff(weights[0], weights[1]) == 0.0
    assert [log["iterations"] for log in logs] == [passes, passes]
    # Over Horovod, the mean is its sum of gradients from losses divided by the workers.
    assert [log["horovod_ops"] for log in logs] == [
        [] if exchange == "shared_memory" else ["Sum"]] * 2
    # One plain SGD step on all passes x workers x batch examples, from rank 0's start.
    x, y = accumulation_data(passes, 2)
    model = dense_model()
    model.set_weights(load_weights(tmp_path / "initial.npz"))
    model.compile(optimizer=keras.optimizers.SGD(0.1),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(x.reshape(-1, 6), y.reshape(-1), batch_size=passes * 2 * ACCUMULATE_BATCH,
              epochs=1, shuffle=False, verbose=0)
    reference = [np.asarray(v) for v in model.trainable_weights]
    assert max_abs_diff(weights[0], reference) < 1e-6
    assert max_abs_diff(weights[0], load_weights(tmp_path / "initial.npz")) > 1e-3
