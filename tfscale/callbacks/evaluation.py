"""Evaluation on the validation split during ``model.fit``: every N steps and at epoch ends."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any

import keras

from tfscale.callbacks.step import optimizer_step

# (model) -> (job-wide metrics, examples evaluated); a collective, e.g.
# tfscale.training.evaluation.Evaluator.evaluate.
Evaluate = Callable[[keras.Model], tuple[dict[str, float], int]]
# Receives each evaluation record (see Evaluation).
Listener = Callable[[dict[str, Any]], None]


class Evaluation(keras.callbacks.Callback):
    """Evaluates the model every ``every`` optimizer steps (0 = never mid-epoch) and at the end
    of each epoch, and adds the metrics to the epoch's logs.

    Each evaluation becomes a record ``{"step", "epoch", "seconds", "examples", "metrics"}``
    (``epoch``: fractional mid-epoch, the epoch number at an epoch end; ``seconds``: wall-clock
    since ``start_time``), kept in :attr:`records` and handed to each listener. A step is
    evaluated at most once. When another callback has stopped training at this step (a
    non-finite loss, preemption) no evaluation is started. Place it after callbacks that stop
    training and before those that read the logs (progress, checkpoints, TensorBoard). Every
    worker must run it (evaluation is a collective).

    Args:
        evaluate: the evaluation.
        every: period in steps, 0 for epoch ends only.
        steps_per_epoch: for the fractional epoch of a mid-epoch evaluation.
        start_time: ``time.time()`` when training started.
        listeners: called with each record, in order.
    """

    def __init__(self, evaluate: Evaluate, every: int, steps_per_epoch: int, start_time: float,
                 listeners: Sequence[Listener] = ()) -> None:
        super().__init__()
        self._evaluate = evaluate
        self.every = every
        self.steps_per_epoch = steps_per_epoch
        self.start_time = start_time
        self.listeners = list(listeners)
        self.records: list[dict[str, Any]] = []
        self.last_duration = 0.0  # seconds the latest evaluation took

    @property
    def step(self) -> int:
        return optimizer_step(self.model)

    def evaluate(self, epoch: float) -> dict[str, Any]:
        """Evaluates now (unless this step already was) and returns the step's record."""
        step = self.step
        if self.records and self.records[-1]["step"] == step:
            return self.records[-1]
        began = time.perf_counter()
        metrics, examples = self._evaluate(self.model)
        self.last_duration = time.perf_counter() - began
        record = {"step": step, "epoch": epoch, "seconds": time.time() - self.start_time,
                  "examples": examples, "metrics": metrics}
        self.records.append(record)
        for listener in self.listeners:
            listener(record)
        return record

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if not self.every:  # no per-step host read of the step counter when unused
            return
        step = self.step
        if step % self.every == 0 and not self.model.stop_training:
            self.evaluate(round(step / self.steps_per_epoch, 4))

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        done = self.records and self.records[-1]["step"] == self.step
        if self.model.stop_training and not done:
            return
        record = self.evaluate(epoch + 1)
        if logs is not None:
            logs.update(record["metrics"])
