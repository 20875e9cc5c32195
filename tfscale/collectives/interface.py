"""What strategies and callbacks need from a communication backend: collectives on host values."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    import keras


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
    from tfscale.collectives.horovod import HorovodCollectives

    return HorovodCollectives()
