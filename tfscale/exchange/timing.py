"""How long each training step waits for its gradient exchange, timed inside the step.

The exchange's share of a step is the time from the moment the last of the step's gradients
exists to the moment the last of them is reduced, over the step's time. That is what the step
waits for: an exchange that overlaps the backward pass (Horovod all-reduces each gradient as
it comes) counts only the part that runs past the end of it. Two ``tf.timestamp`` ops in the
step's graph take the times, one after every gradient and one after every reduced gradient,
and the step adds their difference to two variables of :data:`CLOCK` (a host callback would
cost a step about 80 microseconds more: a call into Python from TensorFlow's executor), which
the progress logger reads each window (``exchange 23%`` on its line, ``step/exchange_share``
and ``step/exchange_ms`` in TensorBoard).

Off unless :func:`enable` is called (``tfscale.train`` does so with several workers): a
script's own optimizer pays nothing for it. Not inside a step that XLA compiles whole
(timestamps do not compile), nor with op determinism on (``--deterministic``:
TensorFlow refuses timestamps there); the logger then shows nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class ExchangeClock:
    """Exchange seconds and steps added by the training steps since the last :meth:`take`:
    two variables that the steps' graphs add to, made by :func:`enable` outside any
    distribution strategy's scope (plain variables of this process, not mirrored)."""

    def __init__(self) -> None:
        self.enabled = False
        self._seconds: Any = None
        self._steps: Any = None

    def _make(self) -> None:
        if self._seconds is not None:
            return  # steps traced earlier keep adding to these
        import tensorflow as tf

        with tf.init_scope():
            self._seconds = tf.Variable(0.0, dtype=tf.float64, trainable=False,
                                        name="exchange_seconds")
            self._steps = tf.Variable(0, dtype=tf.int64, trainable=False, name="exchange_steps")

    def add(self, seconds: Any) -> Any:
        """In a step's graph: adds one exchange of ``seconds`` (a float64 tensor)."""
        import tensorflow as tf

        with tf.control_dependencies([self._seconds.assign_add(seconds)]):
            return self._steps.assign_add(1)

    def take(self) -> tuple[float, int]:
        """(seconds, steps) since the last call; starts counting again. Called between steps
        (Keras' callbacks), so no step adds in between."""
        if self._seconds is None:
            return 0.0, 0
        taken = (float(self._seconds.numpy()), int(self._steps.numpy()))
        self._seconds.assign(0.0)
        self._steps.assign(0)
        return taken


CLOCK = ExchangeClock()


def enable(on: bool = True) -> None:
    """Times the exchange of the optimizers wrapped from now on (:func:`timed`); called
    outside any distribution strategy's scope."""
    if on:
        CLOCK._make()
    CLOCK.enabled = on
    CLOCK.take()


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
    CLOCK.add(elapsed)


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
