"""Tensor fusion: a list of tensors of one dtype as one flat buffer, padded for an even split,
and back (one collective per dtype instead of one per tensor)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any


def fuse(tensors: Sequence[Any], multiple: int) -> Any:
    """One flat buffer of ``tensors`` (same dtype), zero-padded to a multiple of ``multiple``."""
    import tensorflow as tf

    flat = tf.concat([tf.reshape(t, [-1]) for t in tensors], axis=0)
    n = sum(t.shape.num_elements() for t in tensors)
    return tf.pad(flat, [[0, -n % multiple]])


def unfuse(buffer: Any, like: Sequence[Any]) -> list[Any]:
    """Splits a buffer made by :func:`fuse` back into tensors shaped like ``like``."""
    import tensorflow as tf

    sizes = [t.shape.num_elements() for t in like]
    parts = tf.split(buffer[:sum(sizes)], sizes)
    return [tf.reshape(p, t.shape) for p, t in zip(parts, like, strict=True)]
