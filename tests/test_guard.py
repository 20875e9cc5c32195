"""The training guard's agreement schedule: when the workers agree to stop, and on what."""

from __future__ import annotations

import math
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tfscale.callbacks import guard as guard_module
from tfscale.callbacks.guard import TrainingGuard


class Clock:
    """``time.perf_counter`` for the guard, moved on by the test."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class TwoWorkers:
    """The guard's collectives as seen by worker 0 of two; worker 1's values are ``other``."""

    size = 2

    def __init__(self, clock: Clock, collective_s: float) -> None:
        self.clock, self.collective_s = clock, collective_s
        self.other: dict[int, list[float]] = {}  # step -> worker 1's values
        self.calls: list[int] = []
        self.step = 0

    def all_reduce(self, values: Sequence[float], op: str = "mean") -> np.ndarray:
        assert op == "max"
        self.calls.append(self.step)
        self.clock.now += self.collective_s
        other = self.other.get(self.step, [0.0, 0.0, -self.step, values[3], values[4]])
        return np.maximum(np.asarray(values), np.asarray(other))


def _run(comm: Any, clock: Clock, steps: int, step_s: float, periods: Sequence[int] = (),
         bad_losses: Sequence[int] = ()) -> TrainingGuard:
    iterations = SimpleNamespace(value=0)
    # A Keras variable's ``value`` is its backend variable; here a plain int stands for it.
    model = SimpleNamespace(stop_training=False, optimizer=SimpleNamespace(iterations=iterations))
    guard = TrainingGuard(comm, periods)
    guard.set_model(model)
    guard.on_train_begin()
    try:
        for step in range(1, steps + 1):
            clock.now += step_s
            iterations.value = comm.step = step
            guard.on_train_batch_end(step - 1, {"loss": math.nan if step in bad_losses else 1.0})
            if model.stop_training:
                break
    finally:
        guard.on_train_end()
    return guard


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    clock = Clock()
    monkeypatch.setattr(guard_module.time, "perf_counter", clock)
    return clock


def test_agrees_every_step_at_first_then_at_an_interval_that_fits_the_step(clock: Clock) -> None:
    # A 10 ms step and a 2 ms collective: agreeing every 20 steps costs 1% of the time.
    comm = TwoWorkers(clock, collective_s=0.002)
    guard = _run(comm, clock, steps=100, step_s=0.010)
    assert comm.calls[:3] == [1, 2, 22]
    gaps = np.diff(comm.calls[2:])
    assert set(gaps.tolist()) == {20}, comm.calls
    assert guard.reason == "" and guard.agreements == len(comm.calls)


def test_slow_steps_agree_every_step(clock: Clock) -> None:
    comm = TwoWorkers(clock, collective_s=0.005)
    _run(comm, clock, steps=10, step_s=3.0)
    assert comm.calls == list(range(1, 11))


def test_waits_at_most_max_wait_for_a_signal(clock: Clock) -> None:
    # A cheap collective allows long intervals; the wait for a stop caps them.
    comm = TwoWorkers(clock, collective_s=0.05)
    _run(comm, clock, steps=300, step_s=0.1)
    assert max(np.diff(comm.calls)) == int(TrainingGuard.MAX_WAIT_S / 0.1)


def test_agrees_at_checkpoint_and_evaluation_steps(clock: Clock) -> None:
    comm = TwoWorkers(clock, collective_s=0.002)
    _run(comm, clock, steps=100, step_s=0.010, periods=(0, 7))
    assert {7, 14, 21, 28, 35, 42, 49, 56, 63, 70, 77, 84, 91, 98} <= set(comm.calls)


def test_a_non_finite_loss_on_another_worker_stops_both_at_the_next_agreement(
        clock: Clock) -> None:
    comm = TwoWorkers(clock, collective_s=0.002)
    # Worker 1 saw a NaN at step 30 and reports it at the first agreement after it.
    comm.other[42] = [1.0, 0.0, -30.0, 0.010, 0.002]
    guard = _run(comm, clock, steps=100, step_s=0.010)
    assert comm.calls == [1, 2, 22, 42]
    assert guard.reason == "non-finite" and guard.step == 30
    assert guard.model.stop_training


def test_own_non_finite_loss_reports_its_first_step(clock: Clock) -> None:
    comm = TwoWorkers(clock, collective_s=0.002)
    guard = _run(comm, clock, steps=100, step_s=0.010, bad_losses=range(25, 101))
    assert guard.reason == "non-finite" and guard.step == 25
    assert comm.calls[-1] == 42


def test_a_signal_stops_at_the_next_agreement(clock: Clock) -> None:
    comm = TwoWorkers(clock, collective_s=0.002)
    comm.other[22] = [0.0, 15.0, -22.0, 0.010, 0.002]
    guard = _run(comm, clock, steps=100, step_s=0.010)
    assert guard.reason == "preempted" and guard.step == 22 and comm.calls[-1] == 22


def test_one_worker_checks_every_step_without_collectives(clock: Clock) -> None:
    class One:
        size = 1

        def all_reduce(self, values: Sequence[float], op: str = "mean") -> np.ndarray:
            raise AssertionError("no collective with one worker")

    guard = _run(One(), clock, steps=50, step_s=0.01, bad_losses=[17])
    assert guard.reason == "non-finite" and guard.step == 17 and guard.agreements == 0
