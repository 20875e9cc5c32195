"""Setting up a job's gradient exchange: one code path for tfscale's strategies and users' scripts.

The ``horovod`` strategy and ``tfscale.horovod.DistributedOptimizer`` both take their
all-reduce from :func:`horovod_reduction`; the ``multiworker`` strategy and
``tfscale.strategies.keras_multiworker.enable()`` both take theirs from :func:`worker_reduction`.
Each asks
:func:`placement.plan_exchange` what carries the node's part, so a user's script and
``tfscale.train`` exchange through the same transport on the same workers: shared memory where
every rank of a node sees the same ``/dev/shm`` (CPU-only x86-64), hierarchically with the
launcher's transport across nodes (Horovod with dynamic process sets), else the launcher's
transport alone.

A user's script has no ``--node_exchange`` flag; :data:`MODE_VARIABLE` in its environment
plays that part (default ``auto``).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence
from types import ModuleType

import numpy as np

from tfscale.cluster import environment as cluster_env
from tfscale.exchange import cross_node, placement
from tfscale.exchange.hierarchical import (
    HierarchicalAllReduce,
    new_token,
    open_shared_memory,
    shared_memory_group,
)
from tfscale.exchange.horovod_runtime import DYNAMIC_SETS_HINT, horovod_transport
from tfscale.exchange.topology import Topology

#: The environment variable that chooses a user script's node exchange (``--node_exchange``'s
#: values: auto, shared_memory, collectives).
MODE_VARIABLE = "TFSCALE_NODE_EXCHANGE"

# Horovod's background thread wakes every cycle (1 ms by default, tuned for GPU steps) and
# coordinates with the other ranks each time, even with nothing to send. A CPU worker computes
# on the same cores, so the wake-ups slow its steps: two idle ranks here each used 6% of a core
# at 1 ms, 2-7% at 5 ms, 1.2% at 20 ms and 0.9% at 50 ms. 5 ms made ResNet-50's 2-second steps
# 9% faster than 1 ms (bench/RESULTS.md, "Defaults"); longer cycles delay every collective
# that Horovod carries during training.
CPU_CYCLE_TIME_MS = 5.0
# When every rank is on one node and exchanges through shared memory, Horovod carries no
# collective during training (gradients and host values take the segment), only start-up
# broadcasts, so its cycle can be long: the README command (ResNet-50) ran at 9.51, 9.66 and
# 9.84 images/s with 5, 20 and 50 ms (3 alternating rounds).
SHARED_MEMORY_CYCLE_TIME_MS = 50.0
# Where a node's ranks share a core, Open MPI's waiting rank spins through the slice its
# neighbour would compute in (each 5 ms cycle's coordination): exporting
# OMPI_MCA_mpi_yield_when_idle=1 made two ranks on one core 1.5x as fast and Horovod's flat
# runs on the mini-cluster 1.5-2x (bench/RESULTS.md, "Ranks that share a core"). tfscale does
# not set it: with it set, the first CI run failed once with MPI_ERR_TRUNCATE in the mpirun +
# hierarchical case across two nodes, not reproduced in 38 reruns and not explained.


def mode_from_environment(environ: Mapping[str, str] = os.environ) -> str:
    """The node-exchange mode of a user's script: :data:`MODE_VARIABLE`, default "auto".

    Raises:
        ValueError: for a value that is not a mode, naming the variable and the choices.
    """
    mode = environ.get(MODE_VARIABLE, "auto") or "auto"
    if mode not in placement.MODES:
        raise ValueError(f"{MODE_VARIABLE}={mode!r}; expected one of "
                         f"{', '.join(placement.MODES)}")
    return mode


def one_node_shared_memory(mode: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Whether, by the launcher's variables, every rank of the job runs on this node and
    ``mode`` takes shared memory there (so Horovod carries only start-up collectives); False
    also for an explicit mode that cannot run (the exchange's setup then says why)."""
    env = cluster_env.this_process(environ)
    if env.size < 2 or env.local_size != env.size:
        return False
    try:
        return placement.use_shared_memory(mode, env.local_size)
    except ValueError:
        return False


def several_nodes(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether, by the launcher's variables, the ranks of this job span several nodes of
    several ranks each (where a hierarchical exchange needs Horovod's dynamic process sets)."""
    env = cluster_env.this_process(environ)
    return 1 < env.local_size < env.size


def _dynamic_process_sets() -> bool:
    """Whether Horovod runs with dynamic process sets (a hierarchical exchange needs them)."""
    return os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS") == "1"


def horovod_reduction(hvd: ModuleType, rank: int, size: int, mode: str, timeout_s: float = 0.0,
                      ) -> tuple[HierarchicalAllReduce | None, placement.ExchangePlan]:
    """The all-reduce of a Horovod job's gradients when it is not Horovod's
    ``grouped_allreduce``, and the plan that says what carries them: the node phases in shared
    memory where :func:`placement.plan_exchange` takes it (on one node, wholly there; on
    several, hierarchically with Horovod across nodes, which needs dynamic process sets).

    A collective: every rank must call it, in the same order relative to other collectives.
    The result averages when called and sums with ``.sum``; it copies its results (set
    ``transient`` with ``dataclasses.replace`` for gradients used up within the step).

    Args:
        hvd: ``horovod.tensorflow``, initialised.
        rank: this process's rank (``hvd.rank()``).
        size: the job's number of ranks (``hvd.size()``).
        mode: "auto", "shared_memory" or "collectives" (``--node_exchange``).
        timeout_s: how long the shared-memory exchange waits for a peer (0: 600 s).

    Raises:
        ValueError: for "shared_memory" where it cannot run, saying why.
    """
    nodes, local = int(hvd.cross_size()), int(hvd.local_size())
    flat = [range(n * local, (n + 1) * local) for n in range(nodes)]
    if size == 1:
        return None, placement.ExchangePlan(False, "", "")
    if nodes == 1:
        node, plan = open_shared_memory(hvd, Topology.regular(size, size, rank), mode, timeout_s)
        if node is None:
            return None, plan
        return HierarchicalAllReduce.on_one_node(node, plan=plan), plan
    if local > 1 and not _dynamic_process_sets():
        placement.decline(mode, f"across {nodes} nodes, {DYNAMIC_SETS_HINT}")
    collectives = placement.plan_exchange("collectives", flat, [], horovod_transport(hvd))
    if mode == "collectives" or local == 1 or not _dynamic_process_sets():
        return None, collectives
    try:
        reduce = HierarchicalAllReduce.create(node_exchange_mode=mode, timeout_s=timeout_s)
    except ValueError:
        if mode == "shared_memory":
            raise
        # Nodes of unequal size: no hierarchy; every rank raised alike.
        return None, collectives
    assert reduce.plan is not None
    return (reduce if reduce.node is not None else None), reduce.plan


def worker_reduction(rank: int, workers: Sequence[str], mode: str, transport: str,
                     sum_all: Callable[[np.ndarray], np.ndarray], why_not: str = "",
                     timeout_s: float = 0.0,
                     ) -> tuple[HierarchicalAllReduce | None, placement.ExchangePlan]:
    """The shared-memory all-reduce of ``tf.distribute`` workers' gradients where
    :func:`placement.plan_exchange` takes it, else None, and the plan.

    On one host, shared memory carries the whole all-reduce. On several, it carries the node
    phases of the hierarchical all-reduce, and a ring over TCP the cross-node phase among the
    workers with the same local index (:mod:`~tfscale.exchange.cross_node`; not the
    strategy's gRPC, which costs the cores about four times the host time per byte); every
    host must then run as many workers. One replica per worker. A collective where the mode
    allows shared memory and ``why_not`` is empty: every worker decides alike from the same
    mode, workers and reasons, and then all call ``sum_all``.

    Args:
        rank: this worker's index in ``workers``.
        workers: every worker's ``host:port``, by rank (TF_CONFIG's worker list).
        mode: "auto", "shared_memory" or "collectives".
        transport: the strategy's own transport, for the plan ("gRPC (ring collectives)").
        sum_all: the element-wise sum of a float64 vector over all workers (the strategy's
            own collective, used twice while setting up).
        why_not: what the caller knows that keeps shared memory out
            (:func:`placement.workers_limits` of its replicas, XLA, tasks), or "".
        timeout_s: how long the shared-memory exchange waits for a peer (0: 600 s).

    Raises:
        ValueError: for "shared_memory" where it cannot run, saying why.
    """
    hosts = [worker.rsplit(":", 1)[0] for worker in workers]
    nodes = [[r for r, h in enumerate(hosts) if h == host] for host in dict.fromkeys(hosts)]
    why_not = why_not or placement.workers_limits(hosts=hosts)
    if why_not:
        placement.decline(mode, why_not)
    if mode == "collectives" or why_not:
        return None, placement.plan_exchange("collectives", nodes, [], transport)
    size = len(workers)
    domains = placement.gather_strings(placement.shm_domain(), rank, size, sum_all)
    # Rank 0's token names the segment: a sum of its token and everyone else's zeros (a
    # 48-bit integer is exact in float64).
    token = int(sum_all(np.array([float(new_token()) if rank == 0 else 0.0]))[0])
    plan = placement.plan_exchange(mode, nodes, domains, transport)
    topology = Topology(tuple(tuple(node) for node in nodes), rank)
    node = shared_memory_group(token, topology, plan, timeout_s)
    if node is None:
        return None, plan
    if topology.num_nodes == 1:
        return HierarchicalAllReduce.on_one_node(node, name="tfscale.strategies.keras_multiworker",
                                                 plan=plan), plan
    ring = cross_node.open_cross_node_ring(topology, hosts, token, sum_all, timeout_s)
    plan = dataclasses.replace(plan, across=cross_node.TRANSPORT)
    return HierarchicalAllReduce.with_cross_sum(node, topology, cross_node.cross_node_sum(ring),
                                                "tfscale.strategies.keras_multiworker", plan), plan


def transient(reduce: HierarchicalAllReduce, compression: bool = False,
              name: str = "") -> HierarchicalAllReduce:
    """``reduce`` returning views of its buffers (for gradients that the optimizer applies
    within the step), with ``compression`` and, if given, its own tensor names."""
    return dataclasses.replace(reduce, transient=True, compression=compression,
                               name=name or reduce.name)
