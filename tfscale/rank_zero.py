"""Chief-only work goes through here: printing, file writes, summaries.

The active strategy calls :func:`set_rank` once it knows this process's rank; everything else
asks :func:`is_chief` or decorates a function with :func:`rank_zero_only`.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

_rank = 0


def set_rank(rank: int) -> None:
    """Records this process's global rank (0 is the chief)."""
    global _rank
    _rank = rank


def is_chief() -> bool:
    """True on the process that prints and writes files."""
    return _rank == 0


def rank_zero_only(fn: Callable[P, R]) -> Callable[P, R | None]:
    """Runs ``fn`` on the chief only; other ranks get ``None``."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R | None:
        return fn(*args, **kwargs) if is_chief() else None

    return wrapper


@rank_zero_only
def log(message: str) -> None:
    """Prints one progress line from the chief, flushed so launchers stream it."""
    print(message, file=sys.stdout, flush=True)
