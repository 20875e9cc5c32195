"""Metrics reported by task.

Classification: ``accuracy``. Segmentation: pixel ``accuracy``, the intersection over union of
each class ``c`` (``iou_<c>``, from the arg-max of the logits, accumulated over the epoch) and
their mean over the classes present in labels or predictions (``mean_iou``).
"""

from __future__ import annotations

import keras

from tfscale.config.tasks import CLASSIFICATION, SEGMENTATION
from tfscale.config.train_config import TrainConfig


def build_metrics(config: TrainConfig, task: str) -> list[keras.metrics.Metric]:
    """The metrics compiled into the model for ``task``.

    Raises:
        ValueError: for an unknown task.
    """
    accuracy = keras.metrics.SparseCategoricalAccuracy(name="accuracy")
    if task == CLASSIFICATION:
        return [accuracy]
    if task == SEGMENTATION:
        classes = config.num_classes
        per_class = [
            keras.metrics.IoU(classes, target_class_ids=[c], sparse_y_pred=False, name=f"iou_{c}")
            for c in range(classes)
        ]
        mean = keras.metrics.MeanIoU(classes, sparse_y_pred=False, name="mean_iou")
        return [accuracy, *per_class, mean]
    raise ValueError(f"no metrics for task {task!r}")
