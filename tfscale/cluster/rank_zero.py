"""Chief-only work goes through here: printing, file writes, summaries.

The active strategy calls :func:`set_rank` once it knows this process's rank. In a user's own
script (no tfscale strategy), the rank is read from the launcher's variables instead
(horovodrun, mpirun, srun, jsrun, PMI, TF_CONFIG). Everything else asks :func:`is_chief` or
decorates a function with :func:`rank_zero_only`.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Callable, Mapping
from typing import ParamSpec, TypeVar

P = ParamSpec("P")
R = TypeVar("R")

_rank: int | None = None


def set_rank(rank: int) -> None:
    """Records this process's global rank (0 is the chief)."""
    global _rank
    _rank = rank


def launcher_rank(environ: Mapping[str, str] = os.environ) -> int:
    """This process's rank according to the launcher's environment (0 when launched alone)."""
    from tfscale.cluster import environment as cluster_env

    return cluster_env.this_process(environ).rank


def rank() -> int:
    """The rank given to :func:`set_rank`, else the launcher's."""
    return launcher_rank() if _rank is None else _rank


def is_chief() -> bool:
    """True on the process that prints and writes files."""
    return rank() == 0


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
