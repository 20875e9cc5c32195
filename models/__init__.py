"""Model zoo: Keras 3 builders registered by name (see :mod:`models.registry`)."""

from models import deeplabv3plus, resnet50, small, tiramisu  # noqa: F401  (registers builders)
from models.registry import MODELS, register, task_of

__all__ = ["MODELS", "register", "task_of"]
