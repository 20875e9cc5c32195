"""Model zoo: Keras 3 builders registered by name (see :mod:`models.registry`).

Importing the package imports no model module (nor Keras): a builder's module is imported when
the builder is fetched from :data:`MODELS`.
"""

from models.registry import BLOCKS, MODELS, block_rule, declare, register, task_of

__all__ = ["BLOCKS", "MODELS", "block_rule", "declare", "register", "task_of"]
