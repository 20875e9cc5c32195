"""Per-local-rank CPU binding: each worker on a node gets its own share of the cores.

Like the ``numactl``/``jsrun --bind`` settings of the Summit job scripts: without binding, two
workers' thread pools fight over every core. The local rank and size come from the launcher's
variables (tfscale's launcher, horovodrun, OpenMPI, Slurm, jsrun).
"""

from __future__ import annotations

import os
from collections.abc import Mapping


def local_layout(environ: Mapping[str, str] = os.environ) -> tuple[int, int]:
    """(local rank, local size) of this process (:func:`tfscale.cluster_env.this_process`);
    (0, 1) when run alone."""
    from tfscale import cluster_env

    env = cluster_env.this_process(environ)
    return env.local_rank, env.local_size


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


def bind(environ: Mapping[str, str] = os.environ) -> list[int]:
    """Pins this process to its cores; returns them (call before TensorFlow starts)."""
    local_rank, local_size = local_layout(environ)
    cores = cores_for(local_rank, local_size, sorted(os.sched_getaffinity(0)))
    os.sched_setaffinity(0, cores)
    return cores
