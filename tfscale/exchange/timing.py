"""How long each training step waits for its gradient exchange, timed inside the step.

The exchange's share of a step is the time from the moment the last of the step's gradients
exists to the moment the last of them is reduced, over the step's time. That is what the step
waits for: an exchange that overlaps the backward pass (Horovod all-reduces each gradient as
it comes) counts only the part that runs past the end of it. Two ``tf.timestamp`` ops in the
step's graph take the times, one after every gradient and one after every reduced gradient,
and a host callback adds their difference to :data:`CLOCK`, which the progress logger reads
each window (``exchange 23%`` on its line, ``step/exchange_share`` and ``step/exchange_ms`` in
TensorBoard).

Off unless :func:`enable` is called (``tfscale.train`` does so with several workers): a
script's own optimizer pays nothing for it. Not inside a step that XLA compiles whole
(timestamps and host callbacks do not compile), nor with op determinism on (``--deterministic``:
TensorFlow refuses timestamps there); the logger then shows nothing.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import numpy as np


class ExchangeClock:
    """Exchange seconds and steps added by the training steps since the last :meth:`take`."""

    def __init__(self) -> None:
        self.enabled = False
        self._lock = threading.Lock()
        self._seconds = 0.0
        self._steps = 0

    def add(self, seconds: float) -> None:
        with self._lock:
            self._seconds += float(seconds)
            self._steps += 1

    def take(self) -> tuple[float, int]:
        """(seconds, steps) since the last call; starts counting again."""
        with self._lock:
            taken = (self._seconds, self._steps)
            self._seconds, self._steps = 0.0, 0
            return taken


CLOCK = ExchangeClock()


def enable(on: bool = True) -> None:
    """Times the exchange of the optimizers wrapped from now on (:func:`timed`)."""
    CLOCK.enabled = on
    CLOCK.take()


def _record(seconds: np.ndarray) -> np.ndarray:
    CLOCK.add(float(seconds))
    return np.zeros((), np.float64)


def _deterministic() -> bool:
    """Whether op determinism is on (only TensorFlow's internal module tells)."""
    try:
        from tensorflow.python.framework import config
    except ImportError:
        return False
    return bool(getattr(config, "is_op_determinism_enabled", lambda: False)())


def start(tensors: list[Any]) -> Any:
    """A timestamp taken once every tensor in ``tensors`` exists (None when timing is off)."""
    if not CLOCK.enabled or not tensors:
        return None
    import tensorflow as tf

    if _deterministic():
        return None  # TensorFlow refuses timestamps in deterministic runs

    with tf.control_dependencies(_dense(tensors)):
        return tf.timestamp()


def stop(started: Any, tensors: list[Any]) -> None:
    """Adds the time from ``started`` until every tensor in ``tensors`` exists to the clock."""
    if started is None:
        return
    import tensorflow as tf

    with tf.control_dependencies(_dense(tensors)):
        elapsed = tf.timestamp() - started
    # Stateful, so a traced step runs it although nothing consumes its output.
    tf.numpy_function(_record, [elapsed], tf.float64, stateful=True, name="exchange_clock")


def _dense(tensors: list[Any]) -> list[Any]:
    """The tensors to wait for: sparse gradients by their values."""
    return [getattr(t, "values", t) for t in tensors if t is not None]


def timed(reduce: Callable[[list[Any]], list[Any]]) -> Callable[[list[Any]], list[Any]]:
    """``reduce`` (tensors in, reduced tensors out) with its exposed time on the clock, when
    timing was enabled before this call."""
    if not CLOCK.enabled:
        return reduce

    def reduce_timed(tensors: list[Any]) -> list[Any]:
        started = start(tensors)
        out = reduce(tensors)
        stop(started, list(out))
        return out

    return reduce_timed
