"""Ends a worker whose training has stopped moving: a peer or its link is gone and a collective
waits for it forever.

A collective blocked in MPI or in a TCP socket whose peer's link is down has no timeout of its own
(Horovod's stall check needs the coordinator to hear from the others; Open MPI's TCP transport
waits for the kernel's retransmissions, minutes on end). So on every node the ranks would hang
until the scheduler's time limit. The watchdog is a thread that expects a training or evaluation
batch to end at least every ``timeout_s`` seconds once the first step has run (the first one
compiles); when none does, it prints one line and ends the process with ``EXIT_PEER_LOST``
(``os._exit``: the main thread is stuck inside the collective and cannot unwind). The launcher
then sees a failed rank and stops the others, whose own watchdogs fire too if they are stuck.
Checkpoints are written atomically, so the last one is intact.
"""

from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any

import keras

from tfscale.config.errors import EXIT_PEER_LOST


class StepWatchdog(keras.callbacks.Callback):
    """Exits with ``EXIT_PEER_LOST`` when no batch ends for ``timeout_s`` (+ ``GRACE_S``) seconds.

    Args:
        timeout_s: the longest a step (or an evaluation batch, or the work between epochs)
            may take; ``--collective_timeout_s``.
        poll_s: how often the thread looks.
    """

    # A collective with a timeout of its own (TensorFlow's, the same --collective_timeout_s)
    # raises an error that names the lost peer; the watchdog waits this much longer, so that
    # error is reported first where there is one (the two raced: under load the watchdog's
    # vaguer line sometimes came first).
    GRACE_S = 5.0

    def __init__(self, timeout_s: float, poll_s: float = 1.0) -> None:
        super().__init__()
        if timeout_s <= 0:
            raise ValueError(f"--collective_timeout_s={timeout_s:g}: the watchdog needs a "
                             "positive timeout")
        self.timeout_s, self.poll_s = timeout_s, poll_s
        self._last = 0.0  # 0: not armed (before the first step ends, and after training)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _beat(self) -> None:
        self._last = time.monotonic()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._beat()

    def on_test_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._beat()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._beat()

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="tfscale-watchdog",
                                        daemon=True)
        self._thread.start()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._last = 0.0
        self._stop.set()

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            last = self._last
            if last and time.monotonic() - last > self.timeout_s + self.GRACE_S:
                print(f"error: no training step finished in {self.timeout_s:g} s "
                      "(--collective_timeout_s): a peer or its link is lost; stopping this "
                      "worker", file=sys.stderr, flush=True)
                os._exit(EXIT_PEER_LOST)
