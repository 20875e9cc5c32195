"""Loss functions by task.

Both tasks use sparse softmax cross-entropy on float32 logits: per example for classification,
per pixel for segmentation. ``--class_weights`` (see :mod:`tfscale.training.class_weights`)
weights each example or pixel by the weight of its true class, and ``--label_smoothing``
smooths the target distribution. The loss is the mean over examples (and pixels) of the
weighted terms, so a class of weight 0 contributes nothing, and it is always computed in
float32, whatever the precision policy.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import keras
from keras import ops

from tfscale.config.tasks import check_task
from tfscale.config.train_config import TrainConfig
from tfscale.training.class_weights import parse_class_weights


def build_loss(config: TrainConfig, task: str) -> keras.losses.Loss:
    """The training loss for ``task`` (models emit float32 logits).

    Raises:
        ValueError: for an unknown task or invalid ``config.class_weights``.
    """
    check_task(task, "the loss")
    weights = parse_class_weights(config.class_weights, config.num_classes)
    if weights is None and not config.label_smoothing:
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return WeightedCrossEntropy(config.num_classes, weights, config.label_smoothing)


@keras.saving.register_keras_serializable(package="tfscale")
class WeightedCrossEntropy(keras.losses.Loss):
    """Softmax cross-entropy of integer labels, weighted per class, with label smoothing.

    For logits ``z`` (last axis: classes) and label ``y`` the term of one example or pixel is
    ``w[y] * -sum_k t_k log softmax(z)_k`` with ``t = (1 - s) one_hot(y) + s / K``; the loss is
    the mean of the terms over every example and pixel.

    Args:
        num_classes: K.
        class_weights: ``w``, one per class (``None``: all 1).
        label_smoothing: ``s`` in [0, 1).
        name: the loss's name.
    """

    def __init__(
        self,
        num_classes: int,
        class_weights: Sequence[float] | None = None,
        label_smoothing: float = 0.0,
        name: str = "weighted_crossentropy",
        **kwargs: Any,
    ) -> None:
        super().__init__(name=name, **kwargs)
        if class_weights is not None and len(class_weights) != num_classes:
            raise ValueError(f"{len(class_weights)} class weights for {num_classes} classes")
        if not 0 <= label_smoothing < 1:
            raise ValueError(f"label_smoothing={label_smoothing}; expected a value in [0, 1)")
        self.num_classes = num_classes
        self.class_weights = None if class_weights is None else [float(w) for w in class_weights]
        self.label_smoothing = float(label_smoothing)

    def call(self, y_true: Any, y_pred: Any) -> Any:
        labels = ops.cast(y_true, "int32")
        if len(labels.shape) == len(y_pred.shape):  # a trailing axis of size 1
            labels = ops.squeeze(labels, axis=-1)
        log_probs = ops.log_softmax(ops.cast(y_pred, "float32"), axis=-1)
        if self.label_smoothing:
            targets = ops.one_hot(labels, self.num_classes, dtype="float32")
            targets = (1 - self.label_smoothing) * targets + self.label_smoothing / self.num_classes
            terms = -ops.sum(targets * log_probs, axis=-1)
        else:
            picked = ops.take_along_axis(log_probs, ops.expand_dims(labels, -1), axis=-1)
            terms = -ops.squeeze(picked, axis=-1)
        if self.class_weights is not None:
            terms = terms * ops.take(ops.convert_to_tensor(self.class_weights, "float32"), labels)
        return terms

    def get_config(self) -> dict[str, Any]:
        return {
            **super().get_config(),
            "num_classes": self.num_classes,
            "class_weights": self.class_weights,
            "label_smoothing": self.label_smoothing,
        }
