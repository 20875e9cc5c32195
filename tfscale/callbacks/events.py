"""``epoch_end`` lines of events.jsonl."""

from __future__ import annotations

from typing import Any

import keras

from tfscale.callbacks.step import optimizer_step
from tfscale.training.events import EventLog


class EpochEvents(keras.callbacks.Callback):
    """Writes an ``epoch_end`` event (epoch, step, training metrics) to ``log`` at each epoch
    end; place it after the callbacks that complete the logs (metric averaging, evaluation)."""

    def __init__(self, log: EventLog) -> None:
        super().__init__()
        self.log = log

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        metrics = {k: float(v) for k, v in (logs or {}).items() if not k.startswith("val_")}
        self.log.emit("epoch_end", epoch=epoch + 1,
                      step=optimizer_step(self.model), metrics=metrics)
