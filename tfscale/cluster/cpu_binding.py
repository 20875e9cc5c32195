"""Per-local-rank CPU binding: each worker on a node gets its own share of the cores.

Like the ``numactl``/``jsrun --bind`` settings of the Summit job scripts: without binding, two
workers' thread pools fight over every core. The local rank and size come from the launcher's
variables (tfscale's launcher, horovodrun, OpenMPI, Slurm, jsrun).

Binding and thread counts are separate choices (:func:`plan`): ``--intra_op_threads`` sets the
count and leaves the binding as it was chosen; only a count left to the default follows the
binding (one intra-op thread per bound core).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping

# Thread counts TensorFlow reads from the environment when nothing sets them (tfscale-run does).
INTRA_VAR = "TF_NUM_INTRAOP_THREADS"
INTER_VAR = "TF_NUM_INTEROP_THREADS"


def local_layout(environ: Mapping[str, str] = os.environ) -> tuple[int, int]:
    """(local rank, local size) of this process (:func:`tfscale.cluster_env.this_process`);
    (0, 1) when run alone."""
    from tfscale.cluster import environment as cluster_env

    env = cluster_env.this_process(environ)
    return env.local_rank, env.local_size


def binds_by_default(local_workers: int) -> bool:
    """Whether ``local_workers`` workers started together on this machine are bound when
    nobody said: yes when there are several and a core for each. Unbound, each worker sizes
    its thread pools for all the cores and they oversubscribe them (bench/RESULTS.md)."""
    return 1 < local_workers <= len(os.sched_getaffinity(0))


def cores_for(local_rank: int, local_size: int, available: list[int]) -> list[int]:
    """The contiguous block of ``available`` cores that belongs to ``local_rank``.

    Raises:
        ValueError: when there are fewer cores than local workers.
    """
    if local_size > len(available):
        raise ValueError(f"--cpu_binding: {local_size} workers on this node but only "
                         f"{len(available)} cores available to them")
    per = len(available) // local_size
    return available[local_rank * per:(local_rank + 1) * per]


@dataclasses.dataclass(frozen=True)
class Threads:
    """Where a worker runs and how many threads its TensorFlow pools get (0 = TF's choice)."""

    local_rank: int
    local_size: int
    cores: list[int] | None  # the cores it is bound to; None when not bound
    intra: int
    inter: int

    def describe(self, environ: Mapping[str, str] = os.environ) -> str:
        """One line for the worker's log: where it runs and its thread counts, as they are,
        including what it inherited (a launcher's binding and ``TF_NUM_*_THREADS``, which
        ``tfscale-run`` sets and TensorFlow reads at start-up)."""
        allowed = sorted(os.sched_getaffinity(0))
        if self.cores is not None:
            where = f"bound to cores {_listed(self.cores)} (--cpu_binding)"
        elif len(allowed) < (os.cpu_count() or len(allowed)):
            where = f"bound to cores {_listed(allowed)} when it started (by its launcher)"
        else:
            where = f"not bound (any of {len(allowed)} cores)"
        counts = ", ".join(f"{kind}-op threads {_count(n, variable, environ)}"
                           for kind, n, variable in (("intra", self.intra, INTRA_VAR),
                                                     ("inter", self.inter, INTER_VAR)))
        return f"local worker {self.local_rank} of {self.local_size}: {where}; {counts}"


def _listed(cores: list[int]) -> str:
    return ",".join(map(str, cores))


def _count(n: int, variable: str, environ: Mapping[str, str]) -> str:
    if n:
        return str(n)
    return f"{environ[variable]} ({variable})" if environ.get(variable) else "TF default"


def plan(binding: bool, intra: int, inter: int,
         environ: Mapping[str, str] = os.environ) -> Threads:
    """Binds this process when ``binding`` (see :func:`bind`) and sizes its thread pools: a
    count given (> 0) is kept; a bound worker's intra-op count left at 0 becomes its cores.

    Raises:
        ValueError: when binding and there are fewer cores than local workers.
    """
    local_rank, local_size = local_layout(environ)
    cores = bind(environ) if binding else None
    return Threads(local_rank, local_size, cores, intra or len(cores or ()), inter)


def bind(environ: Mapping[str, str] = os.environ) -> list[int]:
    """Pins this process to its cores; returns them (call before TensorFlow starts)."""
    local_rank, local_size = local_layout(environ)
    cores = cores_for(local_rank, local_size, sorted(os.sched_getaffinity(0)))
    os.sched_setaffinity(0, cores)
    return cores
