"""Metrics reported by task."""

from __future__ import annotations

import keras

from tfscale.config import TrainConfig


def build_metrics(config: TrainConfig, task: str) -> list[keras.metrics.Metric]:
    """The metrics compiled into the model for ``task``.

    Raises:
        ValueError: for an unknown task.
    """
    if task == "classification":
        return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]
    raise ValueError(f"no metrics for task {task!r}")
