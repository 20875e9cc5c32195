"""Stops training on a non-finite loss or a preemption signal, on every worker at once."""

from __future__ import annotations

import math
import signal
from types import FrameType
from typing import Any

import keras

from tfscale.collectives.interface import Collectives


class TrainingGuard(keras.callbacks.Callback):
    """After each step, agrees with all workers whether to stop, and why.

    - A non-finite loss on any worker stops everyone (``reason = "non-finite"``), before any
      checkpoint of that step is written (place this callback before the checkpoint callback).
    - SIGTERM or SIGUSR1 (what Slurm sends before the time limit) stops everyone at the next
      step boundary (``reason = "preempted"``) so the trainer can checkpoint and exit.

    The per-step agreement is one all-reduce of two numbers; with one worker it is local.
    """

    SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

    def __init__(self, comm: Collectives) -> None:
        super().__init__()
        self.comm = comm
        self.reason = ""
        self.step = 0
        self._signalled = 0.0
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        self._signalled = float(signum)

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        for sig in self.SIGNALS:
            self._previous[sig] = signal.signal(sig, self._handle)

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        loss = float((logs or {}).get("loss", 0.0))
        flags = [0.0 if math.isfinite(loss) else 1.0, self._signalled]
        if self.comm.size > 1:
            flags = list(self.comm.all_reduce(flags, "max"))
        self.step = int(self.model.optimizer.iterations.numpy())
        if flags[0]:
            self.reason = "non-finite"
        elif flags[1]:
            self.reason = "preempted"
        if self.reason:
            self.model.stop_training = True
