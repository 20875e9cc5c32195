"""Loss functions by task."""

from __future__ import annotations

import keras

from tfscale.config import TrainConfig


def build_loss(config: TrainConfig, task: str) -> keras.losses.Loss:
    """The training loss for ``task`` (models emit float32 logits).

    Raises:
        ValueError: for an unknown task.
    """
    if task == "classification":
        if config.label_smoothing:
            return _SmoothedSparseCrossEntropy(config.num_classes, config.label_smoothing)
        return keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    raise ValueError(f"no loss for task {task!r}")


class _SmoothedSparseCrossEntropy(keras.losses.Loss):
    """Sparse labels with label smoothing (Keras only smooths one-hot labels)."""

    def __init__(self, num_classes: int, smoothing: float) -> None:
        super().__init__(name="smoothed_sparse_crossentropy")
        self.num_classes = num_classes
        self.smoothing = smoothing
        self._xent = keras.losses.CategoricalCrossentropy(
            from_logits=True, label_smoothing=smoothing, reduction=None
        )

    def call(self, y_true, y_pred):  # type: ignore[no-untyped-def]
        one_hot = keras.ops.one_hot(keras.ops.cast(y_true, "int32"), self.num_classes)
        return self._xent(one_hot, y_pred)
