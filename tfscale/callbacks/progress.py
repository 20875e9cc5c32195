"""Chief-only progress lines with a windowed training loss."""

from __future__ import annotations

import math
import time
from typing import Any

import keras

from tfscale import rank_zero
from tfscale.callbacks.step import optimizer_step


class ProgressLogger(keras.callbacks.Callback):
    """Every ``every`` optimizer steps, prints ``step, loss, images/sec`` (chief only).

    Keras logs the epoch's running mean of the loss; the loss over the last window is recovered
    from two running means (k*m_k - j*m_j)/(k - j), so what is printed (and kept in
    :attr:`window_loss`) is this worker's recent loss, not an average since the epoch began.

    Args:
        total_steps: the run's last step, for ``step i/N``.
        every: print period in steps.
        global_batch: examples per step for the whole job.
    """

    def __init__(self, total_steps: int, every: int, global_batch: int) -> None:
        super().__init__()
        self.total_steps = total_steps
        self.every = every
        self.global_batch = global_batch
        self.window_loss = math.nan
        self._mark = (0, 0.0, time.perf_counter())

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._mark = (0, 0.0, time.perf_counter())

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if not logs or "loss" not in logs:
            return
        step = optimizer_step(self.model)
        seen, mean = batch + 1, float(logs["loss"])
        if step % self.every and step != self.total_steps:
            return
        prev_seen, prev_mean, t0 = self._mark
        now = time.perf_counter()
        self.window_loss = (seen * mean - prev_seen * prev_mean) / (seen - prev_seen)
        rate = self.global_batch * (seen - prev_seen) / max(now - t0, 1e-9)
        self._mark = (seen, mean, now)
        rank_zero.log(f"step {step}/{self.total_steps}  loss {self.window_loss:.4f}  "
                      f"{rate:.2f} images/s")

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        shown = "  ".join(f"{k} {float(v):.4g}" for k, v in sorted((logs or {}).items()))
        rank_zero.log(f"epoch {epoch + 1}: {shown}")
