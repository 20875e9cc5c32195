"""Registry of model builders.

A builder takes the run's :class:`~tfscale.config.TrainConfig` and returns an uncompiled
``keras.Model`` whose outputs are float32 probabilities-free logits: ``[B, num_classes]`` for
``task="classification"`` and ``[B, H, W, num_classes]`` for ``task="segmentation"``. Builders
must keep the final logits in float32 under a mixed-precision policy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tfscale.registry import Registry

if TYPE_CHECKING:
    import keras

    from tfscale.config import TrainConfig

ModelBuilder = Callable[["TrainConfig"], "keras.Model"]
TASKS = ("classification", "segmentation")

MODELS: Registry[ModelBuilder] = Registry("model")


def register(name: str, description: str, task: str) -> Callable[[ModelBuilder], ModelBuilder]:
    """Registers a model builder under ``name`` for ``task`` (classification|segmentation)."""
    if task not in TASKS:
        raise ValueError(f"task {task!r} for model {name!r}; expected one of {TASKS}")
    return MODELS.register(name, description, task=task)


def task_of(name: str) -> str:
    """The task (classification|segmentation) of registered model ``name``."""
    return str(MODELS.entry(name).meta["task"])
