"""The ``default`` strategy: one process, one device."""

from __future__ import annotations

from tfscale.strategies.base import SingleProcessStrategy

# The strategy a config names when none is chosen (``TrainConfig.strategy``).
DEFAULT_STRATEGY = "default"


class DefaultStrategy(SingleProcessStrategy):
    """One process on one device (TensorFlow's default placement)."""
