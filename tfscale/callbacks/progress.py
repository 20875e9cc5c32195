"""Chief-only progress lines: windowed loss, images/s, elapsed time and ETA of run and epoch."""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import keras
import numpy as np

from tfscale.callbacks.step import optimizer_step
from tfscale.cluster import rank_zero
from tfscale.exchange import timing
from tfscale.training.durations import clock


@dataclasses.dataclass(frozen=True)
class Window:
    """What one progress line reports; the logger's listeners get it too.

    ``images_per_sec`` and ``step_time_ms`` are NaN for a window whose only step was the
    first of a ``fit`` call (tracing and compilation), ``eta`` and ``epoch_eta`` until a step
    after the first has been timed. ``exchange_ms`` (the mean time a step waited for its
    gradient exchange) and ``exchange_share`` (that over the mean step time) are NaN unless
    the exchange is timed (:mod:`tfscale.exchange.timing`: ``tfscale.train`` with several
    workers).
    """

    step: int
    total_steps: int
    epoch: int
    epoch_step: int
    epoch_steps: int
    loss: float
    images_per_sec: float
    step_time_ms: float
    learning_rate: float
    elapsed: float
    eta: float
    epoch_elapsed: float
    epoch_eta: float
    exchange_ms: float = math.nan
    exchange_share: float = math.nan

    def line(self) -> str:
        """``step 40/100  loss 0.1234  12.30 images/s  elapsed 0:01:02  ETA 0:01:30  |  epoch
        2 15/30  elapsed 0:00:20  ETA 0:00:15``; ``12.30 images/s (exchange 23%)`` when the
        exchange is timed."""
        rate = ("images/s after compilation" if math.isnan(self.images_per_sec)
                else f"{self.images_per_sec:.2f} images/s")
        if math.isfinite(self.exchange_share):
            rate += f" (exchange {self.exchange_share:.0%})"
        return (f"step {self.step}/{self.total_steps}  loss {self.loss:.4f}  {rate}  "
                f"elapsed {clock(self.elapsed)}  ETA {_eta(self.eta)}  |  epoch {self.epoch} "
                f"{self.epoch_step}/{self.epoch_steps}  elapsed {clock(self.epoch_elapsed)}  "
                f"ETA {_eta(self.epoch_eta)}")


def _eta(seconds: float) -> str:
    return "?" if math.isnan(seconds) else clock(seconds)


class ProgressLogger(keras.callbacks.Callback):
    """Every ``every`` optimizer steps (and at the last), prints a progress line (chief only).

    The loss is of the last window: Keras logs the epoch's running mean, and the window's mean
    is recovered from two running means, (k*m_k - j*m_j)/(k - j). With ``average`` (every
    worker must have this callback, as each calls it at the same steps) the line shows the
    mean of the workers' windows, which :attr:`window_loss` keeps; without it, this worker's.

    images/s counts the steps of the window, their data waits and callbacks, but neither the
    first step of a ``fit`` call (tracing and compilation; the first one is printed once as
    ``first step compiled in 14.2 s``), nor the work between epochs, nor what :meth:`exclude`
    is told (evaluations). The ETAs extrapolate the wall time per step since that first step,
    evaluations and checkpoints included.

    Args:
        total_steps: the run's last step, for ``step i/N`` and the run's ETA.
        every: print period in steps.
        global_batch: examples per step for the whole job.
        steps_per_epoch: steps of a whole epoch, so that a resumed partial epoch counts from
            the epoch's true start; by default the ``fit`` call's ``steps_per_epoch``.
        average: mean over the workers of a small vector (e.g. a strategy's ``all_reduce``).
        listeners: called with each :class:`Window`, on every process.
    """

    def __init__(self, total_steps: int, every: int, global_batch: int,
                 steps_per_epoch: int | None = None,
                 average: Callable[[Sequence[float]], Any] | None = None,
                 listeners: Sequence[Callable[[Window], None]] = ()) -> None:
        super().__init__()
        self.total_steps = total_steps
        self.every = every
        self.global_batch = global_batch
        self.steps_per_epoch = steps_per_epoch
        self.average = average
        self.listeners = list(listeners)
        self.window_loss = math.nan
        self.compile_seconds: float | None = None
        self._run_start: float | None = None
        self._fit_start = self._epoch_start = 0.0
        self._epoch = 1
        self._last: float | None = None  # end of the previous timed step
        self._timed_from: tuple[float, int] | None = None  # (time, step) after compilation
        self._mark = (0, 0.0)  # (batches seen this epoch, their mean loss) at the last line
        self._window = (0, 0.0)  # (timed steps, their seconds) since the last line

    def exclude(self, seconds: float) -> None:
        """Leaves ``seconds`` of work just done between two steps (an evaluation) out of
        images/s."""
        if self._last is not None:
            self._last += seconds

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._fit_start = time.perf_counter()
        if self._run_start is None:
            self._run_start = self._fit_start
        self._last = None

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch_start = time.perf_counter()
        self._epoch = epoch + 1
        self._mark = (0, 0.0)
        if self._last is not None:
            self._last = self._epoch_start

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        now = time.perf_counter()
        step = optimizer_step(self.model)
        self._time_step(now, step)
        if not logs or "loss" not in logs or (step % self.every and step != self.total_steps):
            return
        seen, mean = batch + 1, float(logs["loss"])
        prev_seen, prev_mean = self._mark
        loss = (seen * mean - prev_seen * prev_mean) / (seen - prev_seen)
        if self.average is not None:
            loss = float(np.asarray(self.average([loss]))[0])
        self.window_loss = loss
        self._mark = (seen, mean)
        timed, seconds = self._window
        self._window = (0, 0.0)
        exchange_s, exchanges = timing.CLOCK.take()
        exchange = exchange_s / exchanges if exchanges else math.nan
        done, length = self._epoch_position(batch, step)
        per_step = self._seconds_per_step(now, step)
        started = now if self._run_start is None else self._run_start
        window = Window(
            step=step, total_steps=self.total_steps, epoch=self._epoch, epoch_step=done,
            epoch_steps=length, loss=loss,
            images_per_sec=self.global_batch * timed / seconds if timed else math.nan,
            step_time_ms=1000.0 * seconds / timed if timed else math.nan,
            learning_rate=self._learning_rate(), elapsed=now - started,
            eta=per_step * (self.total_steps - step), epoch_elapsed=now - self._epoch_start,
            epoch_eta=per_step * (length - done), exchange_ms=1000.0 * exchange,
            exchange_share=exchange * timed / seconds if timed else math.nan)
        rank_zero.log(window.line())
        for listener in self.listeners:
            listener(window)

    def _time_step(self, now: float, step: int) -> None:
        if self._last is None:
            timing.CLOCK.take()  # the compiled step's exchange, like its time, is left out
            if self.compile_seconds is None:
                self.compile_seconds = now - self._fit_start
                rank_zero.log(f"first step compiled in {self.compile_seconds:.1f} s "
                              "(left out of images/s)")
            if self._timed_from is None:
                self._timed_from = (now, step)
        else:
            timed, seconds = self._window
            self._window = (timed + 1, seconds + now - self._last)
        self._last = now

    def _epoch_position(self, batch: int, step: int) -> tuple[int, int]:
        """Steps done in this epoch, and its length."""
        if not self.steps_per_epoch:
            return batch + 1, int(self.params.get("steps") or 0)
        first = (self._epoch - 1) * self.steps_per_epoch
        return step - first, min(self.steps_per_epoch, self.total_steps - first)

    def _seconds_per_step(self, now: float, step: int) -> float:
        if self._timed_from is None or step <= self._timed_from[1]:
            return math.nan
        start, first = self._timed_from
        return (now - start) / (step - first)

    def _learning_rate(self) -> float:
        try:
            return float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))
        except (AttributeError, TypeError, ValueError):
            return math.nan

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        shown = "  ".join(f"{k} {float(v):.4g}" for k, v in sorted((logs or {}).items()))
        rank_zero.log(f"epoch {epoch + 1}: {shown}")
