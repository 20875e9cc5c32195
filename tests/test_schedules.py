"""WarmupDecay: values at chosen steps, argument checks, serialization, build_schedule."""

from __future__ import annotations

import math
from typing import Any

import keras
import pytest

from tfscale.config.train_config import TrainConfig
from tfscale.training.optimizers import WarmupDecay, build_schedule


def values(schedule: WarmupDecay, steps: list[int]) -> list[float]:
    return [float(schedule(step)) for step in steps]


@pytest.mark.parametrize(("kwargs", "steps", "expected"), [
    ({"decay": "constant"}, [0, 7, 1000], [0.4, 0.4, 0.4]),
    ({"decay": "constant", "warmup_steps": 4}, [0, 1, 3, 4, 50], [0.1, 0.2, 0.4, 0.4, 0.4]),
    ({"decay": "cosine", "total_steps": 10}, [0, 5, 10, 12],
     [0.4, 0.2, 0.0, 0.0]),
    ({"decay": "cosine", "warmup_steps": 2, "total_steps": 10}, [0, 1, 2, 4, 6, 10],
     [0.2, 0.4, 0.4, 0.2 * (1 + math.cos(math.pi / 4)), 0.2, 0.0]),
    ({"decay": "step", "boundaries": [5, 8], "factor": 0.5}, [0, 4, 5, 7, 8, 100],
     [0.4, 0.4, 0.2, 0.2, 0.1, 0.1]),
    ({"decay": "step", "warmup_steps": 2, "boundaries": [5], "factor": 0.1}, [0, 1, 2, 5],
     [0.2, 0.4, 0.4, 0.04]),
    ({"decay": "polynomial", "total_steps": 8}, [0, 2, 4, 8, 9],
     [0.4, 0.4 * 0.75**2, 0.1, 0.0, 0.0]),
    ({"decay": "polynomial", "warmup_steps": 4, "total_steps": 8}, [3, 4, 6, 8],
     [0.4, 0.4, 0.1, 0.0]),
])
def test_values_at_chosen_steps(kwargs: dict[str, Any], steps: list[int],
                                expected: list[float]) -> None:
    assert values(WarmupDecay(0.4, **kwargs), steps) == pytest.approx(expected, abs=1e-7)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"decay": "exponential"}, "decay='exponential'.*constant, cosine, step, polynomial"),
    ({"peak": 0.0}, "peak=0.0"),
    ({"warmup_steps": -1}, "warmup_steps=-1"),
    ({"decay": "cosine", "warmup_steps": 10, "total_steps": 10},
     r"cosine decay needs total_steps \(10\) > warmup_steps \(10\)"),
    ({"decay": "polynomial"}, r"polynomial decay needs total_steps \(0\)"),
    ({"decay": "step"}, "step decay needs boundaries"),
    ({"decay": "step", "boundaries": [8, 5]}, r"boundaries=\[8, 5\] must be positive and"),
    ({"decay": "step", "boundaries": [0, 5]}, r"boundaries=\[0, 5\]"),
    ({"decay": "step", "boundaries": [5], "factor": 0.0}, r"factor=0.0.*\(0, 1\]"),
])
def test_invalid_arguments_raise_clear_errors(kwargs: dict[str, Any], message: str) -> None:
    args = {"peak": 0.1, **kwargs}
    with pytest.raises(ValueError, match=message):
        WarmupDecay(**args)


def test_serialization_round_trip() -> None:
    schedule = WarmupDecay(0.3, warmup_steps=3, total_steps=20, decay="step",
                           boundaries=(10, 15), factor=0.2)
    copy = keras.optimizers.schedules.deserialize(keras.optimizers.schedules.serialize(schedule))
    assert type(copy) is WarmupDecay
    assert copy.get_config() == schedule.get_config()
    steps = [0, 2, 3, 10, 15]
    assert values(copy, steps) == pytest.approx(values(schedule, steps))


def test_build_schedule_follows_config() -> None:
    cfg = TrainConfig(model="tiny_cnn", steps=100, learning_rate=0.05, lr_scaling="linear",
                      warmup_steps=10, lr_schedule="step", lr_decay_steps="40,80",
                      lr_decay_factor=0.1)
    schedule = build_schedule(cfg, world_size=8, total_steps=100)
    assert values(schedule, [0, 9, 39, 40, 80]) == pytest.approx([0.04, 0.4, 0.4, 0.04, 0.004])
    flat = build_schedule(cfg.replace(lr_scaling="none"), world_size=8, total_steps=100)
    assert float(flat(9)) == pytest.approx(0.05)
