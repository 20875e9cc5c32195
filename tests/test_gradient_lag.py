"""Gradient lag (``--gradient_lag=1``) against a NumPy model of the lagged update.

The model is linear with mean squared error, so each step's averaged gradient has a closed
form. With the lag, step s applies the gradient computed at step s-1 (at the weights before
that step, on that step's batch); the first step applies zero. The same NumPy model without
the lag must match the runs without it, and the lagged and unlagged trajectories must differ,
so the comparison can fail.
"""

from __future__ import annotations

import sys
from pathlib import Path

import keras
import numpy as np
import pytest

from tests.conftest import TINY, horovodrun, read_results, requires_horovod, run_process, run_train
from tests.workers.gradient_lag import LEARNING_RATE, global_batches, linear_model
from tfscale.config.train_config import TrainConfig
from tfscale.exchange import with_gradient_reduction

WORKER = [sys.executable, "-m", "tests.workers.gradient_lag"]
STEPS, BATCH = 4, 3


def numpy_trajectory(kernel: np.ndarray, bias: np.ndarray, x: np.ndarray, y: np.ndarray,
                     lag: int) -> tuple[np.ndarray, np.ndarray]:
    """Kernels and biases after each step of SGD on mean squared error over each step's
    global batch (what workers that average equal-sized batches' gradients compute), with
    each gradient applied ``lag`` steps after it was computed."""
    kernel, bias = kernel.astype(np.float64), bias.astype(np.float64)
    pending: list[tuple[np.ndarray, np.ndarray]] = []
    kernels, biases = [], []
    for xs, ys in zip(x.astype(np.float64), y.astype(np.float64), strict=True):
        error = xs @ kernel + bias - ys
        scale = 2.0 / error.size  # d mean((xW + b - y)^2)
        pending.append((scale * xs.T @ error, scale * error.sum(axis=0)))
        if len(pending) > lag:
            grad_kernel, grad_bias = pending.pop(0)
            kernel, bias = kernel - LEARNING_RATE * grad_kernel, bias - LEARNING_RATE * grad_bias
        kernels.append(kernel)
        biases.append(bias)
    return np.stack(kernels), np.stack(biases)


def _assert_follows(path: Path, workers: int, lag: int) -> None:
    run = np.load(path)
    x, y = global_batches(STEPS, BATCH * workers)
    kernels, biases = numpy_trajectory(run["kernel0"], run["bias0"], x, y, lag)
    other_kernels, _ = numpy_trajectory(run["kernel0"], run["bias0"], x, y, 1 - lag)
    assert np.max(np.abs(run["kernels"] - kernels)) < 1e-5
    assert np.max(np.abs(run["biases"] - biases)) < 1e-5
    assert np.max(np.abs(run["kernels"][-1] - other_kernels[-1])) > 1e-2, "lag made no difference"


@pytest.mark.parametrize("lag", [0, 1])
def test_one_process_follows_the_numpy_model(lag: int) -> None:
    """The optimizer wrapper alone (an identity exchange), in this process."""
    x, y = global_batches(STEPS, BATCH)
    model = linear_model()
    kernel0, bias0 = model.get_weights()
    model.compile(optimizer=with_gradient_reduction(keras.optimizers.SGD(LEARNING_RATE),
                                                    lambda grads: grads, gradient_lag=lag),
                  loss="mse")
    kernels, biases = [], []
    for xs, ys in zip(x, y, strict=True):
        model.train_on_batch(xs, ys)
        kernels.append(model.get_weights()[0])
        biases.append(model.get_weights()[1])
    want_kernels, want_biases = numpy_trajectory(kernel0, bias0, x, y, lag)
    assert np.max(np.abs(np.stack(kernels) - want_kernels)) < 1e-5
    assert np.max(np.abs(np.stack(biases) - want_biases)) < 1e-5
    # Optimizer steps count every step, the priming one included.
    assert int(model.optimizer.iterations.numpy()) == STEPS


def test_lag_is_refused_where_it_cannot_work() -> None:
    for strategy in ("default", "mirrored", "multiworker"):
        with pytest.raises(ValueError, match=r"--gradient_lag only applies to "
                                             r"--strategy=ddl or --strategy=horovod"):
            TrainConfig(strategy=strategy, gradient_lag=1)
    with pytest.raises(ValueError, match=r"--gradient_lag=2 is not valid; expected 0"):
        TrainConfig(strategy="horovod", gradient_lag=2)
    with pytest.raises(ValueError, match="mixed_float16"):
        TrainConfig(strategy="horovod", gradient_lag=1, precision="mixed_float16")
    scaled = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    with pytest.raises(ValueError, match="LossScaleOptimizer"):
        with_gradient_reduction(scaled, lambda grads: grads, gradient_lag=1)
    with pytest.raises(ValueError, match="backward_passes_per_step"):
        with_gradient_reduction(keras.optimizers.SGD(0.1), lambda grads: grads,
                                backward_passes_per_step=2, gradient_lag=1)


@pytest.mark.slow
@requires_horovod
@pytest.mark.parametrize(("strategy", "lag"), [("horovod", 1), ("horovod", 0), ("ddl", 1)])
def test_two_workers_follow_the_numpy_model(tmp_path: Path, strategy: str, lag: int) -> None:
    """Two real workers average their halves' gradients and apply them one step late."""
    proc = run_process([horovodrun(), "--gloo", "-np", "2", "-H", "localhost:2",
                        *WORKER, f"--strategy={strategy}", f"--lag={lag}",
                        f"--steps={STEPS}", f"--batch={BATCH}", f"--out={tmp_path}"],
                       timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    for rank in range(2):
        _assert_follows(tmp_path / f"rank{rank}.npz", workers=2, lag=lag)


@pytest.mark.slow
@requires_horovod
def test_train_runs_with_gradient_lag(tmp_path: Path) -> None:
    proc = run_train(*TINY, "--strategy=horovod", "--num_processes=2", "--gradient_lag=1",
                     "--steps=3", f"--model_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = read_results(tmp_path)
    assert results["steps"] == 3 and results["config"]["gradient_lag"] == 1
