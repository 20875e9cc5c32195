"""Stops training on a non-finite loss or a preemption signal, on every worker at the same step."""

from __future__ import annotations

import math
import signal
import time
from collections.abc import Sequence
from types import FrameType
from typing import Any

import keras

from tfscale.callbacks.step import optimizer_step
from tfscale.cluster import preemption
from tfscale.exchange.interface import Collectives


class TrainingGuard(keras.callbacks.Callback):
    """Agrees with all workers whether to stop, and why.

    - A non-finite loss on any worker stops everyone (``reason = "non-finite"``; ``step`` is
      the first step where a worker saw it).
    - SIGTERM or SIGUSR1 (what Slurm sends before the time limit) stops everyone at an agreed
      step boundary (``reason = "preempted"``) so the trainer can checkpoint and exit.

    With one worker the check is local, after every step. With several it is one host
    all-reduce of a few numbers, which costs milliseconds (Horovod's or gRPC's round trip):
    every step, that is a large share of a short GPU step. So the workers agree at steps
    they all compute the same way: every step at first, then every ``interval`` steps, where
    ``interval`` keeps the agreement under :data:`BUDGET` of the step time and the wait for
    a stop under :data:`MAX_WAIT_S` (both measured, as the slowest worker's, at each
    agreement). They also agree at every epoch end and at every multiple of ``periods``
    (the checkpoint and evaluation intervals), so nothing is checkpointed or evaluated after
    a step the workers have not agreed on. A worker that sees a non-finite loss keeps training
    until the next agreement; checkpoints refuse non-finite weights meanwhile.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)
    BUDGET = 0.01  # of the step time, spent on agreeing
    MAX_WAIT_S = 2.0  # longest wait between a signal and the agreed stop, in steady state
    MAX_INTERVAL = 1000

    def __init__(self, comm: Collectives, periods: Sequence[int] = ()) -> None:
        super().__init__()
        self.comm = comm
        self.periods = [p for p in periods if p > 0]
        self.reason = ""
        self.step = 0
        self.agreements = 0
        self._signalled = 0.0
        self._first_bad = 0
        self._next_check = 0
        self._last_check: tuple[int, float] = (0, 0.0)
        self._collective_s = 0.0
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._signalled = float(signum)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)
        # A warning that came while the process started (tfscale.cluster.preemption) stops at the
        # first agreement.
        self._signalled = self._signalled or float(preemption.warned())
        self._last_check = (optimizer_step(self.model), time.perf_counter())
        self._next_check = self._last_check[0] + 1

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        step = optimizer_step(self.model)
        if not self._first_bad and not math.isfinite(float((logs or {}).get("loss", 0.0))):
            self._first_bad = step
        if (self.comm.size == 1 or step >= self._next_check
                or any(step % p == 0 for p in self.periods)):
            self._agree(step)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        step = optimizer_step(self.model)
        if step != self._last_check[0]:
            self._agree(step)

    def _agree(self, step: int) -> None:
        now = time.perf_counter()
        last_step, last_time = self._last_check
        step_s = (now - last_time) / max(1, step - last_step)
        flags = [float(self._first_bad > 0), self._signalled, -float(self._first_bad or step),
                 step_s, self._collective_s]
        if self.comm.size > 1:
            flags = list(self.comm.all_reduce(flags, "max"))
            self.agreements += 1
        done = time.perf_counter()
        self._collective_s = done - now
        self._last_check = (step, done)
        self._next_check = step + self._interval(flags[3], flags[4])
        self.step = step
        if flags[0]:
            self.reason, self.step = "non-finite", int(-flags[2])
        elif flags[1]:
            self.reason = "preempted"
        if self.reason:
            self.model.stop_training = True

    def _interval(self, step_s: float, collective_s: float) -> int:
        """Steps to the next agreement: the same on every worker, since it is computed from
        all-reduced figures."""
        if step_s <= 0:
            return 1
        cheap = math.ceil(collective_s / (self.BUDGET * step_s))
        return max(1, min(cheap, int(self.MAX_WAIT_S / step_s), self.MAX_INTERVAL))
