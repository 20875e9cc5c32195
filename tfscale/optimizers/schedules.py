"""Learning-rate schedules for large-batch training: linear warmup, then a decay."""

from __future__ import annotations

import math
from typing import Any

import keras
from keras import ops


@keras.saving.register_keras_serializable(package="tfscale")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to ``peak`` over ``warmup_steps`` (Goyal et al. 2017), then
    ``constant``, ``cosine`` (to 0 at ``total_steps``), ``step`` (times ``factor`` at each
    boundary) or ``polynomial`` (power 2, to 0 at ``total_steps``)."""

    def __init__(
        self, peak: float, warmup_steps: int = 0, total_steps: int = 0, decay: str = "constant",
        boundaries: tuple[int, ...] | list[int] = (), factor: float = 0.1,
    ) -> None:
        if decay in ("cosine", "polynomial") and total_steps <= warmup_steps:
            raise ValueError(
                f"{decay} decay needs total_steps ({total_steps}) > warmup_steps ({warmup_steps})"
            )
        self.peak = float(peak)
        self.warmup_steps = int(warmup_steps)
        self.total_steps = int(total_steps)
        self.decay = decay
        self.boundaries = tuple(int(b) for b in boundaries)
        self.factor = float(factor)

    def __call__(self, step: Any) -> Any:
        step = ops.cast(step, "float32")
        if self.decay == "constant":
            decayed = ops.convert_to_tensor(self.peak, "float32")
        elif self.decay == "step":
            crossed = sum(ops.cast(step >= b, "float32") for b in self.boundaries)
            decayed = self.peak * ops.power(self.factor, crossed)
        else:
            span = float(self.total_steps - self.warmup_steps)
            progress = ops.clip((step - self.warmup_steps) / span, 0.0, 1.0)
            if self.decay == "cosine":
                decayed = 0.5 * self.peak * (1.0 + ops.cos(math.pi * progress))
            else:
                decayed = self.peak * ops.square(1.0 - progress)
        if self.warmup_steps:
            warm = self.peak * (step + 1.0) / self.warmup_steps
            return ops.where(step < self.warmup_steps, warm, decayed)
        return decayed

    def get_config(self) -> dict[str, Any]:
        return {"peak": self.peak, "warmup_steps": self.warmup_steps,
                "total_steps": self.total_steps, "decay": self.decay,
                "boundaries": list(self.boundaries), "factor": self.factor}
