"""ProgressLogger's lines (elapsed time and ETA, the compiled first step left out) on a
simulated clock, and StepSummaries' per-step TensorBoard scalars read back from the event
files."""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from tfscale.callbacks import ProgressLogger, StepSummaries, ThroughputMeter
from tfscale.callbacks import progress as progress_module
from tfscale.callbacks import throughput as throughput_module
from tfscale.callbacks.progress import Window
from tfscale.training.durations import clock
from tfscale.training.results import describe_final_loss


class Run:
    """Drives a ProgressLogger as ``model.fit`` would, on a clock the test sets."""

    def __init__(self, logger: ProgressLogger, monkeypatch: pytest.MonkeyPatch,
                 others: tuple[Any, ...] = ()) -> None:
        self.now = 0.0
        monkeypatch.setattr(progress_module.time, "perf_counter", lambda: self.now)
        monkeypatch.setattr(throughput_module.time, "perf_counter", lambda: self.now)
        self.logger = logger
        self.callbacks = (logger, *others)
        self.model: Any = SimpleNamespace(optimizer=SimpleNamespace(
            iterations=0, learning_rate=np.float32(0.25)))
        logger.set_model(self.model)
        logger.set_params({"steps": 3})
        self.losses: list[float] = []

    def fit(self, epochs: range, at: list[list[float]]) -> None:
        """Epochs ``epochs`` whose batches end at the times of ``at`` (one list per epoch);
        each epoch starts when the previous one's last batch ended plus 5 s (its evaluation)."""
        for callback in self.callbacks:
            callback.on_train_begin()
        for epoch, times in zip(epochs, at, strict=True):
            for callback in self.callbacks:
                callback.on_epoch_begin(epoch)
            self.losses = []
            for batch, t in enumerate(times):
                self.now = t
                self.model.optimizer.iterations += 1
                self.losses.append(float(self.model.optimizer.iterations))  # loss = step
                for callback in self.callbacks:
                    callback.on_train_batch_end(batch, {"loss": np.mean(self.losses)})
            self.now += 5.0


def test_lines_have_elapsed_and_eta_and_leave_the_compiled_step_out(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    windows: list[Window] = []
    logger = ProgressLogger(total_steps=9, every=2, global_batch=8, steps_per_epoch=3,
                            listeners=[windows.append])
    run = Run(logger, monkeypatch)
    # Step 1 compiles (10 s), then 1 s per step; 5 s between epochs (not training).
    run.fit(range(0, 2), [[10.0, 11.0, 12.0], [18.0, 19.0, 20.0]])
    run.now = 30.0  # a second fit call (resuming): its first step is not timed either
    run.fit(range(2, 3), [[40.0, 41.0, 42.0]])
    out = capsys.readouterr().out
    assert out.count("first step compiled in") == 1
    assert "first step compiled in 10.0 s (left out of images/s)" in out
    lines = [ln for ln in out.splitlines() if ln.startswith("step ")]
    assert [w.step for w in windows] == [2, 4, 6, 8, 9]
    # Step 2: one timed step of 1 s; 1 s per step since the compiled one.
    assert lines[0] == ("step 2/9  loss 1.5000  8.00 images/s  elapsed 0:00:11  ETA 0:00:07  |  "
                        "epoch 1 2/3  elapsed 0:00:11  ETA 0:00:01")
    # Step 4: steps 3 and 4 took 1 s each; the 5 s between the epochs are not training, but
    # the ETA's wall time per step counts them: (18 - 10) / 3 steps.
    assert windows[1].images_per_sec == pytest.approx(8.0)
    assert windows[1].step_time_ms == pytest.approx(1000.0)
    assert windows[1].eta == pytest.approx(5 * 8 / 3)
    assert (windows[1].epoch, windows[1].epoch_step, windows[1].epoch_steps) == (2, 1, 3)
    assert windows[1].epoch_elapsed == pytest.approx(1.0)
    assert windows[1].epoch_eta == pytest.approx(2 * 8 / 3)
    # The window's loss, not the epoch's running mean: epoch 2 saw steps 4..6; the window of
    # step 6 holds steps 5 and 6.
    assert windows[2].loss == pytest.approx(5.5)
    # Step 8: only step 8 (41 - 40) is timed in the window: step 7 started a fit call.
    assert windows[3].images_per_sec == pytest.approx(8.0)
    assert windows[4].eta == 0.0 and windows[4].learning_rate == 0.25
    assert logger.window_loss == pytest.approx(9.0)
    assert re.search(r"step 9/9  loss 9\.0000 .* ETA 0:00:00  \|  epoch 3 3/3 ", out)


def test_the_summary_times_the_steps_the_lines_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The summary's images/s (ThroughputMeter) is the lines' windows together: neither
    counts a fit call's first step nor the 5 s between epochs (the meter counted those, and
    the summary read below every line)."""
    windows: list[Window] = []
    logger = ProgressLogger(total_steps=9, every=2, global_batch=8, steps_per_epoch=3,
                            listeners=[windows.append])
    meter = ThroughputMeter(8)
    run = Run(logger, monkeypatch, others=(meter,))
    run.fit(range(0, 2), [[10.0, 11.0, 12.0], [18.0, 20.0, 21.0]])
    run.now = 30.0
    run.fit(range(2, 3), [[40.0, 41.0, 42.0]])
    # The windows of steps 2, 4, 6, 8 and 9 time 1, 2, 2, 1 and 1 steps (7 and 1 begin fit
    # calls): 8 s in all.
    seconds = sum(w.step_time_ms / 1000.0 * n for w, n in zip(windows, (1, 2, 2, 1, 1),
                                                             strict=True))
    assert meter.steps == 7 and meter.seconds == pytest.approx(seconds) == 8.0
    assert meter.images_per_sec == pytest.approx(8 * 7 / 8.0)


def test_a_window_of_only_the_compiled_step_has_no_rate_and_the_loss_is_averaged(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    other_worker = 3.0
    logger = ProgressLogger(total_steps=3, every=1, global_batch=4,
                            average=lambda v: (np.asarray(v) + other_worker) / 2)
    run = Run(logger, monkeypatch)
    run.fit(range(0, 1), [[7.0, 8.0, 9.0]])
    lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("step ")]
    assert lines[0].startswith("step 1/3  loss 2.0000  images/s after compilation  "
                               "elapsed 0:00:07  ETA ?  |  epoch 1 1/3")
    assert logger.window_loss == pytest.approx((3.0 + other_worker) / 2)
    assert describe_final_loss({"num_workers": 2, "config": {"log_every": 10}}) == (
        "final loss (last progress line: up to 10 steps, mean of 2 workers)")


def _drive(logger: ProgressLogger, losses: np.ndarray) -> None:
    """One epoch of ``len(losses)`` steps whose batch-mean losses are ``losses``."""
    logger.set_model(SimpleNamespace(optimizer=SimpleNamespace(iterations=0, learning_rate=0.1)))
    logger.set_params({"steps": len(losses)})
    logger.on_train_begin()
    logger.on_epoch_begin(0)
    for batch in range(len(losses)):
        logger.model.optimizer.iterations += 1
        logger.on_train_batch_end(batch, {"loss": float(np.mean(losses[:batch + 1]))})


def test_two_workers_mean_loss_is_one_process_loss_of_both_batches() -> None:
    per_worker = np.random.default_rng(0).uniform(0.0, 3.0, (2, 7))  # batch-mean losses
    barrier, sent = threading.Barrier(2, timeout=30), [0.0, 0.0]

    def average_on(rank: int) -> Callable[[list[float]], list[float]]:  # a mean all-reduce
        def average(values: list[float]) -> list[float]:
            sent[rank] = values[0]
            barrier.wait()
            mean = (sent[0] + sent[1]) / 2
            barrier.wait()
            return [mean]
        return average

    windows: list[list[Window]] = [[], [], []]
    workers = [ProgressLogger(7, 3, 8, average=average_on(r), listeners=[windows[r].append])
               for r in range(2)]
    threads = [threading.Thread(target=_drive, args=(workers[r], per_worker[r]))
               for r in range(2)]
    for thread in threads:
        thread.start()
    # One process, both batches: each step's loss is the mean of the two equal-sized batches'.
    _drive(ProgressLogger(7, 3, 16, listeners=[windows[2].append]), per_worker.mean(axis=0))
    for thread in threads:
        thread.join(timeout=30)
    assert [w.step for w in windows[2]] == [3, 6, 7]
    for rank in range(2):
        assert [w.step for w in windows[rank]] == [3, 6, 7]
        np.testing.assert_allclose([w.loss for w in windows[rank]],
                                   [w.loss for w in windows[2]], atol=1e-5)
    assert workers[0].window_loss == pytest.approx(per_worker[:, 6].mean(), abs=1e-5)


def test_step_summaries_write_every_tag_at_the_window_step(tmp_path: Path) -> None:
    import tensorflow as tf

    write = StepSummaries(tmp_path)
    def window(step: int, loss: float, rate: float, step_ms: float, lr: float) -> Window:
        return Window(step=step, total_steps=20, epoch=1, epoch_step=step, epoch_steps=20,
                      loss=loss, images_per_sec=rate, step_time_ms=step_ms, learning_rate=lr,
                      elapsed=1.0, eta=1.0, epoch_elapsed=1.0, epoch_eta=1.0)

    write(window(5, 0.5, float("nan"), float("nan"), 0.1))
    write(window(10, 0.25, 64.0, 125.0, 0.05))
    seen: dict[str, dict[int, float]] = {}
    for path in sorted(tmp_path.glob("events.out.tfevents*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                seen.setdefault(value.tag, {})[event.step] = float(
                    tf.make_ndarray(value.tensor))
    assert seen == {"step/loss": {5: 0.5, 10: 0.25},
                    "step/learning_rate": {5: pytest.approx(0.1), 10: pytest.approx(0.05)},
                    "step/images_per_sec": {10: 64.0}, "step/step_time_ms": {10: 125.0}}


def test_clock() -> None:
    assert clock(3725.4) == "1:02:05" and clock(0.4) == "0:00:00" and clock(-1) == "0:00:00"
