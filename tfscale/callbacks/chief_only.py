"""Run any Keras callback on the chief only (TensorBoard, ModelCheckpoint, CSV logs, ...)."""

from __future__ import annotations

from typing import Any

import keras

from tfscale.cluster import rank_zero


class ChiefOnly(keras.callbacks.Callback):
    """Forwards every event to ``callback`` on the chief; other workers do nothing.

    Example: ``ChiefOnly(keras.callbacks.TensorBoard("logs"))`` in every worker's callback
    list writes one set of TensorBoard logs instead of one per worker.
    """

    def __init__(self, callback: keras.callbacks.Callback) -> None:
        super().__init__()
        self.callback = callback
        self.active = rank_zero.is_chief()

    def set_model(self, model: keras.Model) -> None:
        super().set_model(model)
        if self.active:
            self.callback.set_model(model)

    def set_params(self, params: dict[str, Any]) -> None:
        super().set_params(params)
        if self.active:
            self.callback.set_params(params)

    def __getattribute__(self, name: str) -> Any:
        # Every on_* hook (there are 18 in Keras 3) is forwarded, or a no-op off the chief.
        if name.startswith("on_"):
            if object.__getattribute__(self, "active"):
                return getattr(object.__getattribute__(self, "callback"), name)
            return _ignore
        return object.__getattribute__(self, name)


def _ignore(*args: Any, **kwargs: Any) -> None:
    return None
