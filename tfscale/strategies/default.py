"""The ``default`` strategy: one process, one device."""

from __future__ import annotations

from tfscale.config.train_config import DEFAULT_STRATEGY
from tfscale.strategies.base import SingleProcessStrategy

__all__ = ["DEFAULT_STRATEGY", "DefaultStrategy"]


class DefaultStrategy(SingleProcessStrategy):
    """One process on one device (TensorFlow's default placement)."""
