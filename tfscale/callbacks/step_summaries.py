"""Per-step TensorBoard scalars, written from the progress logger's windows."""

from __future__ import annotations

import math
import os
from typing import Any

from tfscale.callbacks.progress import Window

# tag -> the Window field it shows
TAGS = {"step/loss": "loss", "step/learning_rate": "learning_rate",
        "step/images_per_sec": "images_per_sec", "step/step_time_ms": "step_time_ms",
        "step/exchange_ms": "exchange_ms", "step/exchange_share": "exchange_share"}


class StepSummaries:
    """A :class:`~tfscale.callbacks.ProgressLogger` listener that writes each window's loss,
    learning rate, images/s, step time and, when the exchange is timed (several workers under
    ``tfscale.train``), the time a step waited for its gradient exchange and that time's share
    of the step, as TensorBoard scalars at the window's step, under
    ``directory``: every ``every`` steps of the logger, beside Keras' epoch scalars and the
    evaluation's. Create it on the chief only::

        progress = ProgressLogger(total_steps, every=10, global_batch=256,
                                  listeners=[StepSummaries("logs/steps")])

    A value the window does not have (the images/s of a window holding only the compiled first
    step) is left out rather than written as NaN.
    """

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = str(directory)
        self._writer: Any = None

    def __call__(self, window: Window) -> None:
        import tensorflow as tf

        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.directory)
        with self._writer.as_default(step=window.step):
            for tag, field in TAGS.items():
                value = float(getattr(window, field))
                if math.isfinite(value):
                    tf.summary.scalar(tag, value)
        self._writer.flush()
