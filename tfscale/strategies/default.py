"""The ``default`` strategy: one process, one device."""

from __future__ import annotations

from tfscale.strategies.base import SingleProcessStrategy


class DefaultStrategy(SingleProcessStrategy):
    """One process on one device (TensorFlow's default placement)."""
