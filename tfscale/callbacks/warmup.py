"""Gradual learning-rate warmup (Goyal et al. 2017) as a callback."""

from __future__ import annotations

from typing import Any

import keras

from tfscale.callbacks.step import optimizer_step


class LearningRateWarmup(keras.callbacks.Callback):
    """Raises the learning rate linearly from ``start_lr`` to ``target_lr`` over
    ``warmup_steps`` optimizer steps, then leaves it at ``target_lr``.

    With ``k`` workers and the linear scaling rule, ``target_lr = k * base_lr`` and the
    default ``start_lr = target_lr / k = base_lr``: training starts at the single-worker rate
    and reaches the scaled one without the early instability of a large rate.

    Args:
        target_lr: the rate at the end of warmup.
        warmup_steps: number of optimizer steps of warmup (> 0).
        num_workers: ``k`` above, used only for the default ``start_lr``.
        start_lr: the rate at step 0 (default ``target_lr / num_workers``).

    Raises:
        ValueError: for a non-positive step count or rate; at the start of training when the
            optimizer's learning rate is a schedule (use the schedule's own warmup then).
    """

    def __init__(self, target_lr: float, warmup_steps: int, num_workers: int = 1,
                 start_lr: float | None = None) -> None:
        super().__init__()
        if warmup_steps < 1 or target_lr <= 0 or num_workers < 1:
            raise ValueError(f"LearningRateWarmup(target_lr={target_lr}, warmup_steps="
                             f"{warmup_steps}, num_workers={num_workers}): all must be > 0")
        self.target_lr = target_lr
        self.warmup_steps = warmup_steps
        self.start_lr = target_lr / num_workers if start_lr is None else start_lr

    def rate(self, step: int) -> float:
        """The learning rate for optimizer step ``step`` (0-based)."""
        if step >= self.warmup_steps:
            return self.target_lr
        return self.start_lr + (self.target_lr - self.start_lr) * step / self.warmup_steps

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        lr = self.model.optimizer.learning_rate
        if not isinstance(lr, keras.Variable) and not hasattr(lr, "assign"):
            raise ValueError("LearningRateWarmup needs an optimizer with a constant learning "
                             "rate; the optimizer has a schedule, so put the warmup in it "
                             "(tfscale.training.optimizers.schedules.WarmupDecay)")

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        step = optimizer_step(self.model)
        if step <= self.warmup_steps:
            self.model.optimizer.learning_rate.assign(self.rate(step))
