"""``--profile_steps=A:B``: a TensorFlow profiler trace of training steps A to B."""

from __future__ import annotations

from typing import Any

import keras

from tfscale.callbacks.step import optimizer_step


class ProfileSteps(keras.callbacks.Callback):
    """Traces training steps ``first`` to ``last`` (1-based, inclusive, counted over the whole
    run, resumed runs included) with TensorFlow's profiler into ``logdir``, where TensorBoard's
    profile tab finds it (``logdir/plugins/profile/RUN/*.xplane.pb``).

    Keras's own TensorBoard callback counts the batches of each ``fit`` call; this one reads
    the optimizer's step counter once, at the start, and counts from there, so ``A:B`` means
    the same steps as ``--steps``, checkpoints and the event log. A run that stops before
    ``last`` still gets its trace, up to where it stopped.
    """

    def __init__(self, first: int, last: int, logdir: str) -> None:
        super().__init__()
        self.first, self.last, self.logdir = first, last, logdir
        self.step = 0  # the step about to run, 1-based
        self.tracing = False
        self.traced = False

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.step = optimizer_step(self.model) + 1

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if not self.traced and not self.tracing and self.first <= self.step <= self.last:
            import tensorflow as tf

            tf.profiler.experimental.start(self.logdir)
            self.tracing = True

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.tracing and self.step >= self.last:
            self._stop()
        self.step += 1

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self.tracing:
            self._stop()

    def _stop(self) -> None:
        import tensorflow as tf

        tf.profiler.experimental.stop()
        self.tracing, self.traced = False, True
