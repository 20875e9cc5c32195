"""What strategies and callbacks need from a communication backend: collectives on host values."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

if TYPE_CHECKING:
    import keras


# The reductions of host collectives, applied to every process's values gathered as rows.
REDUCERS: dict[str, Callable[..., Any]] = {
    "mean": np.mean, "sum": np.sum, "max": np.max, "min": np.min}


def check_op(op: str) -> None:
    """Raises ValueError unless ``op`` is one of :data:`REDUCERS` (call before the collective,
    so that a bad op fails without waiting for the other processes)."""
    if op not in REDUCERS:
        raise ValueError(f"all_reduce op {op!r}; expected one of {sorted(REDUCERS)}")


def reduce_rows(rows: np.ndarray, op: str) -> np.ndarray:
    """``op`` over the rows of ``rows`` (one row per process, in rank order)."""
    check_op(op)
    return np.asarray(REDUCERS[op](rows, axis=0), dtype=np.float64)


class Collectives(Protocol):
    """Implemented by every tfscale strategy and by Horovod's ``HorovodCollectives``."""

    @property
    def rank(self) -> int: ...

    @property
    def size(self) -> int: ...

    def all_reduce(self, values: Sequence[float] | np.ndarray, op: str = "mean") -> np.ndarray: ...

    def broadcast_variables(self, variables: Sequence[keras.Variable], root: int = 0) -> None: ...


def default_collectives(comm: Collectives | None) -> Collectives:
    """``comm``, or Horovod's collectives for a user script that passes none."""
    if comm is not None:
        return comm
    from tfscale.exchange.horovod_runtime import HorovodCollectives

    return HorovodCollectives()


class Entry:
    """A named value outside the Keras variables that a checkpoint holds (the gradient lag's
    pending gradients): a ``path`` and either a value to save (an array) or a
    ``tf.Variable`` to restore into (:mod:`tfscale.training.checkpointing`)."""

    def __init__(self, path: str, value: Any) -> None:
        self.path, self.value = path, value

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.value.shape)

    def numpy(self) -> np.ndarray:
        return np.asarray(self.value)

    def assign(self, value: np.ndarray) -> None:
        self.value.assign(value)
