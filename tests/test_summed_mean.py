"""The optimizer wrapper's mean as a sum of gradients from a divided loss (``summed``).

Two workers that see the same batch stand in for a job: their mean is each one's gradient and
their sum twice it, so a wrapper that sums must divide the loss by two for the step to match a
plain optimizer's, bit for bit (a division by a power of two commutes with the rounding).
"""

from __future__ import annotations

from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfscale.exchange import with_gradient_reduction

STEPS = 3


def _model() -> keras.Model:
    keras.utils.set_random_seed(3)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(5, activation="relu"),
                             keras.layers.BatchNormalization(), keras.layers.Dense(3)])


def _batches() -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.default_rng(0)
    return [(rng.standard_normal((8, 6)).astype(np.float32),
             rng.integers(0, 3, 8)) for _ in range(STEPS)]


class _Workers:
    """Reductions over ``workers`` identical workers, counting their calls."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self.means = self.sums = 0

    def mean(self, grads: list[Any]) -> list[Any]:
        self.means += 1
        return list(grads)

    def sum(self, grads: list[Any]) -> list[Any]:
        self.sums += 1
        return [g * tf.cast(self.workers, g.dtype) for g in grads]


def _fit(optimizer: keras.optimizers.Optimizer) -> list[np.ndarray]:
    model = _model()
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    for x, y in _batches():
        model.train_on_batch(x, y)
    return model.get_weights()


def _custom_loop(optimizer: keras.optimizers.Optimizer) -> list[np.ndarray]:
    model = _model()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)

    @tf.function
    def step(x: Any, y: Any) -> None:
        with tf.GradientTape() as tape:
            value = loss(y, model(x, training=True))
        grads = tape.gradient(value, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables, strict=True))

    for x, y in _batches():
        step(x, y)
    return model.get_weights()


def test_keras_train_step_sums_gradients_of_the_divided_loss_bit_for_bit() -> None:
    plain = _fit(keras.optimizers.SGD(0.1, momentum=0.9))
    workers = _Workers(2)
    wrapped = _fit(with_gradient_reduction(keras.optimizers.SGD(0.1, momentum=0.9),
                                           workers.mean, summed=workers.sum, workers=2))
    assert workers.sums and not workers.means  # counted per trace of the step
    for got, want in zip(wrapped, plain, strict=True):
        np.testing.assert_array_equal(got, want)


def test_without_the_divided_loss_a_sum_would_double_the_step() -> None:
    # The check above can fail: summing without the division steps twice as far.
    plain = _fit(keras.optimizers.SGD(0.1))
    workers = _Workers(2)
    doubled = _fit(with_gradient_reduction(keras.optimizers.SGD(0.1), workers.sum))
    assert max(np.max(np.abs(a - b)) for a, b in zip(doubled, plain, strict=True)) > 1e-3


def test_three_workers_match_within_float32_rounding() -> None:
    plain = _fit(keras.optimizers.SGD(0.1, momentum=0.9))
    workers = _Workers(3)
    wrapped = _fit(with_gradient_reduction(keras.optimizers.SGD(0.1, momentum=0.9),
                                           workers.mean, summed=workers.sum, workers=3))
    assert workers.sums and not workers.means
    for got, want in zip(wrapped, plain, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)


def test_a_step_without_scale_loss_gets_the_mean() -> None:
    plain = _custom_loop(keras.optimizers.SGD(0.1))
    workers = _Workers(2)
    wrapped = _custom_loop(with_gradient_reduction(keras.optimizers.SGD(0.1), workers.mean,
                                                   summed=workers.sum, workers=2))
    assert workers.means and not workers.sums
    for got, want in zip(wrapped, plain, strict=True):
        np.testing.assert_array_equal(got, want)


def test_a_loss_scale_optimizer_divides_its_scaled_loss() -> None:
    plain = _fit(keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1)))
    workers = _Workers(2)
    optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
    wrapped = _fit(with_gradient_reduction(optimizer, workers.mean, summed=workers.sum,
                                           workers=2))
    assert workers.sums and not workers.means
    for got, want in zip(wrapped, plain, strict=True):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize(("lag", "workers"), [(1, 2), (0, 1)])
def test_a_lag_or_one_worker_keeps_the_mean(lag: int, workers: int) -> None:
    counts = _Workers(workers)
    _fit(with_gradient_reduction(keras.optimizers.SGD(0.1), counts.mean, gradient_lag=lag,
                                 summed=counts.sum, workers=workers))
    assert counts.means and not counts.sums


def test_workers_below_one_are_refused() -> None:
    with pytest.raises(ValueError, match="workers=0"):
        with_gradient_reduction(keras.optimizers.SGD(0.1), list, summed=list, workers=0)
