"""Model zoo: Keras 3 builders registered by name (see :mod:`models.registry`)."""

from models import resnet50, small  # noqa: F401  (imported to register their builders)
from models.registry import MODELS, register, task_of

__all__ = ["MODELS", "register", "task_of"]
