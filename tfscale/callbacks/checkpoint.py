"""Chief-only periodic checkpoints."""

from __future__ import annotations

import math
import warnings
from typing import Any

import keras

from tfscale.callbacks.step import optimizer_step
from tfscale.cluster import rank_zero
from tfscale.exchange.optimizer import averaged_lag_gradients
from tfscale.exchange.sharded_update import gather_momentum
from tfscale.training.checkpointing import CheckpointError, CheckpointManager


class Checkpoint(keras.callbacks.Callback):
    """Saves the model's weights and optimizer state through a :class:`CheckpointManager`
    every ``every`` optimizer steps (0 = at each epoch end), on the chief only.

    A step whose logged loss or whose weights are not finite is never saved, so the last good
    checkpoint survives a divergence. ``meta`` is saved with each checkpoint (``tfscale.train``
    records the global batch its steps are of).
    """

    def __init__(self, manager: CheckpointManager, every: int = 0,
                 meta: dict[str, Any] | None = None) -> None:
        super().__init__()
        self.manager = manager
        self.every = every
        self.meta = dict(meta or {})
        self.last_saved = -1

    @property
    def step(self) -> int:
        return optimizer_step(self.model)

    def save(self, logs: dict[str, Any] | None = None) -> None:
        """Saves now (chief only) unless this step is already saved or its loss is not finite.

        Every worker calls it at the same steps: with a gradient lag, the pending gradients
        are averaged over the workers first (a collective) and saved beside the variables;
        with a sharded update, every worker's share of the momentum is gathered first (a
        collective too).
        """
        step = self.step
        if step == self.last_saved:
            return
        self.last_saved = step
        pending = averaged_lag_gradients(self.model.optimizer)
        gather_momentum(self.model.optimizer)
        loss = (logs or {}).get("loss")
        if (loss is not None and not math.isfinite(float(loss))) or not rank_zero.is_chief():
            return
        variables = list(self.model.weights) + list(self.model.optimizer.variables)
        try:
            self.manager.save(step, variables, self.meta, optional=pending)
        except CheckpointError as err:
            warnings.warn(str(err), stacklevel=2)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        if self.every and self.step % self.every == 0:
            self.save(logs)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if not self.every:
            self.save(logs)
