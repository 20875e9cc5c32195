"""Stops training on every worker at the same step once a target metric is reached."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import keras

from tfscale.callbacks.step import optimizer_step
from tfscale.config.targets import Target
from tfscale.exchange.interface import Collectives


class TargetStop(keras.callbacks.Callback):
    """Checks ``target`` at each epoch end (training and validation metrics of the logs) and,
    through :meth:`check_record`, after each evaluation; stops training once it is reached.

    Workers agree on the decision with one all-reduce (``max``) of the verdict, so they stop
    at the same step even if their copies of a metric differed in the last bit. Every worker
    must run it at the same points. Place it after :class:`~tfscale.callbacks.Evaluation`
    and after the strategy's metric averaging.

    Args:
        target: what to reach.
        comm: the strategy's collectives.
        start_time: ``time.time()`` when training started (``seconds`` = time to target).
        listeners: called once with the :attr:`result` when the target is reached:
            ``{"metric", "value" (the target), "direction", "achieved" (the metric's value),
            "step", "epoch", "seconds"}``.
    """

    def __init__(self, target: Target, comm: Collectives, start_time: float,
                 listeners: Sequence[Callable[[dict[str, Any]], None]] = ()) -> None:
        super().__init__()
        self.target = target
        self.comm = comm
        self.start_time = start_time
        self.listeners = list(listeners)
        self.result: dict[str, Any] | None = None

    def check(self, metrics: Mapping[str, Any], epoch: float) -> bool:
        """Stops training when ``metrics`` meet the target on any worker; True when reached."""
        if self.result is not None:
            return True
        value = float(metrics.get(self.target.metric, math.nan))
        verdict = 1.0 if self.target.reached(value) else 0.0
        if self.comm.size > 1:
            verdict = float(self.comm.all_reduce([verdict], "max")[0])
        if not verdict:
            return False
        self.model.stop_training = True
        self.result = {"metric": self.target.metric, "value": self.target.value,
                       "direction": self.target.direction, "achieved": value,
                       "step": optimizer_step(self.model), "epoch": epoch,
                       "seconds": time.time() - self.start_time}
        for listener in self.listeners:
            listener(self.result)
        return True

    def check_record(self, record: dict[str, Any]) -> None:
        """An :class:`~tfscale.callbacks.Evaluation` listener."""
        self.check(record["metrics"], record["epoch"])

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.check(logs or {}, epoch + 1)
