"""Throughput and step-time meter."""

from __future__ import annotations

import time
from typing import Any

import keras


class ThroughputMeter(keras.callbacks.Callback):
    """Measures step time and images/sec as the wall time between consecutive batch ends, so
    data waits and every callback's work count. Left out, as the progress lines leave them
    out (so that the summary is the progress lines' steps together): the first step of each
    ``fit`` call (graph tracing and compilation), the work between epochs (epoch-end
    callbacks, a new epoch's iterator) and what :meth:`exclude` is told (evaluations).
    Reported in the epoch logs too.

    Args:
        global_batch: examples consumed per step by the whole job.
    """

    def __init__(self, global_batch: int) -> None:
        super().__init__()
        self.global_batch = global_batch
        self.seconds = 0.0
        self.steps = 0
        self._last: float | None = None

    def exclude(self, seconds: float) -> None:
        """Leaves ``seconds`` of work just done between two steps (an evaluation) out of the
        measurement."""
        if self._last is not None:
            self._last += seconds

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._last = None

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._last is not None:
            self._last = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        now = time.perf_counter()
        if self._last is not None:
            self.seconds += now - self._last
            self.steps += 1
        self._last = now

    @property
    def step_time_ms(self) -> float:
        """Mean time per measured step, in milliseconds (0 before any measured step)."""
        return 1000.0 * self.seconds / self.steps if self.steps else 0.0

    @property
    def images_per_sec(self) -> float:
        """Job-wide examples per second over the measured steps."""
        return self.global_batch * self.steps / self.seconds if self.seconds else 0.0

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None and self.steps:
            logs["images_per_sec"] = self.images_per_sec
            logs["step_time_ms"] = self.step_time_ms
