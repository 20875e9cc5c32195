"""Learning-rate schedules for large-batch training: linear warmup, then a decay."""

from __future__ import annotations

import math
from typing import Any

import keras
from keras import ops

from tfscale.config.train_config import (
    LR_SCHEDULES as DECAYS,  # one list, which --lr_schedule checks too
)


def _check_args(peak: float, warmup_steps: int, total_steps: int, decay: str,
                boundaries: tuple[int, ...], factor: float) -> None:
    """Raises a ValueError naming the first bad argument of :class:`WarmupDecay`."""
    if decay not in DECAYS:
        raise ValueError(f"decay={decay!r} is not valid; choose one of: {', '.join(DECAYS)}")
    if not peak > 0:
        raise ValueError(f"peak={peak} is not valid; expected a learning rate > 0")
    if warmup_steps < 0 or total_steps < 0:
        raise ValueError(f"warmup_steps={warmup_steps} and total_steps={total_steps} "
                         "must both be >= 0")
    if decay in ("cosine", "polynomial") and total_steps <= warmup_steps:
        raise ValueError(
            f"{decay} decay needs total_steps ({total_steps}) > warmup_steps ({warmup_steps})"
        )
    if decay == "step":
        if not boundaries:
            raise ValueError("step decay needs boundaries, e.g. (30, 60)")
        if list(boundaries) != sorted(set(boundaries)) or boundaries[0] <= 0:
            raise ValueError(f"boundaries={list(boundaries)} must be positive and increasing")
        if not 0 < factor <= 1:
            raise ValueError(f"factor={factor} is not valid; expected a value in (0, 1]")


@keras.saving.register_keras_serializable(package="tfscale")
class WarmupDecay(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup to ``peak`` (Goyal et al. 2017), then a decay.

    Step ``s < warmup_steps`` (counted from 0) gets ``peak * (s + 1) / warmup_steps``, so the
    last warmup step reaches ``peak``. Afterwards: ``constant`` keeps ``peak``; ``cosine`` and
    ``polynomial`` (power 2) fall from ``peak`` at ``warmup_steps`` to 0 at ``total_steps``;
    ``step`` multiplies ``peak`` by ``factor`` at each of the ``boundaries`` (absolute steps).

    Args:
        peak: the learning rate after warmup, > 0.
        warmup_steps: length of the warmup, >= 0 (0: no warmup).
        total_steps: length of the run; needed by ``cosine`` and ``polynomial``.
        decay: one of ``constant``, ``cosine``, ``step``, ``polynomial``.
        boundaries: increasing positive steps at which ``step`` decay multiplies by ``factor``.
        factor: the ``step`` decay's multiplier, in (0, 1].

    Raises:
        ValueError: naming the bad argument and what is expected.
    """

    def __init__(
        self, peak: float, warmup_steps: int = 0, total_steps: int = 0, decay: str = "constant",
        boundaries: tuple[int, ...] | list[int] = (), factor: float = 0.1,
    ) -> None:
        _check_args(peak, warmup_steps, total_steps, decay, tuple(boundaries), factor)
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
