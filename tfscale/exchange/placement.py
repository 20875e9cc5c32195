"""Which processes share a node, and what carries each phase of the gradient exchange.

The one owner of the per-node transport decision: the ``horovod``, ``ddl`` and
``multiworker`` strategies (and the hierarchical all-reduce under them) all ask
:func:`plan_exchange`.

"The same node" has two meanings that a cluster keeps apart and a single machine blurs:

- the launcher's grouping (Horovod's local ranks, the hosts of a ``TF_CONFIG``, Slurm's node
  list): a :class:`~tfscale.exchange.topology.Topology`;
- whether two processes can map the same file in ``/dev/shm``: the *shared-memory domain* of
  :func:`shm_domain` (the kernel's boot id, and the device and inode of ``/dev/shm``).

Shared memory may only carry the node phases when every node of the topology is one domain.
Nodes whose host names happen to be equal but whose ``/dev/shm`` differs (containers, Linux
namespaces, a mis-set ``HOROVOD_HOSTNAME``) look like one node to the launcher; their domains
tell them apart, and the exchange then stays on the strategy's own transport. Simulated nodes on
one machine (``--ddl_local_size``) share a domain, which is harmless: each node gets its own
segment.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import platform
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from tfscale.config.options import Option
from tfscale.exchange import shared_memory

MODES = ("auto", "shared_memory", "collectives")
SHARED_MEMORY = "shared memory"
_NAME_BYTES = 64  # HOST_NAME_MAX
_BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def shm_domain(directory: Path = shared_memory.SHM_DIR) -> str:
    """This process's shared-memory domain: equal for two processes exactly when a file one
    creates in ``directory`` is the file the other opens (same kernel, same mount)."""
    try:
        boot = _BOOT_ID.read_text().strip()
    except OSError:
        boot = platform.node()
    try:
        st = os.stat(directory)
        where = f"{st.st_dev}:{st.st_ino}"
    except OSError:
        where = "none"
    return hashlib.sha256(f"{boot}:{where}".encode()).hexdigest()[:16]


def gather_strings(text: str, rank: int, size: int,
                   all_reduce_sum: Callable[[np.ndarray], np.ndarray]) -> list[str]:
    """Every process's ``text`` (up to 64 UTF-8 bytes), in rank order, through any sum
    all-reduce of float64 values: each process fills its own row of a zero table."""
    data = text.encode()[:_NAME_BYTES]
    table = np.zeros((size, _NAME_BYTES), np.float64)
    table[rank, :len(data)] = np.frombuffer(data, np.uint8)
    summed = np.asarray(all_reduce_sum(table.reshape(-1))).reshape(size, _NAME_BYTES)
    return [bytes(int(b) for b in row if b).decode(errors="replace") for row in summed]


def decline(mode: str, why: str) -> None:
    """Shared memory cannot carry the node exchange, because ``why``: the one error, where
    ``--node_exchange=shared_memory`` asked for it; nothing otherwise (``auto`` takes the
    strategy's own collectives).

    Raises:
        ValueError: naming the flag, the reason and the way out.
    """
    if mode == "shared_memory":
        raise ValueError(f"--node_exchange=shared_memory cannot run: {why}; use "
                         "--node_exchange=collectives")


def workers_limits(replicas_per_worker: int = 1, whole_step_xla: bool = False,
                   other_tasks: Sequence[str] = (), hosts: Sequence[str] = ()) -> str:
    """Why shared memory cannot carry the gradients of ``tf.distribute`` workers (the
    ``multiworker`` strategy's, or a user's MultiWorkerMirroredStrategy script's), or "".

    Args:
        replicas_per_worker: replicas of each worker (the exchange sums one per worker).
        whole_step_xla: XLA compiles the whole training step (the exchange runs on the host).
        other_tasks: TF_CONFIG's task types besides ``worker``.
        hosts: every worker's host, by rank (nodes must run as many workers each).
    """
    if other_tasks:
        return f"the cluster has {', '.join(other_tasks)} tasks besides its workers"
    if whole_step_xla:
        return ("XLA compiles the whole training step there, and the shared-memory exchange "
                "runs on the host outside XLA; use --xla=auto")
    if replicas_per_worker > 1:
        return f"each worker has {replicas_per_worker} replicas"
    counts = {host: list(hosts).count(host) for host in dict.fromkeys(hosts)}
    if len(set(counts.values())) > 1:
        return ("the workers exchange through shared memory inside nodes only with as many "
                f"workers on every node, and the {len(counts)} hosts run "
                + ", ".join(f"{host} {n}" for host, n in counts.items()))
    return ""


def use_shared_memory(mode: str, local_size: int) -> bool:
    """Whether ``mode`` (``--node_exchange``) takes shared memory for nodes of ``local_size``
    processes, from this machine alone: "auto" takes it on CPU-only x86-64 nodes.

    Raises:
        ValueError: for an unknown mode, or "shared_memory" where it cannot work, saying why.
    """
    if mode not in MODES:
        raise ValueError(f"--node_exchange={mode!r}; choose one of {', '.join(MODES)}")
    if mode == "collectives" or local_size == 1:
        return False
    why_not = shared_memory.available()
    if why_not:
        decline(mode, why_not)
        return False
    if mode == "auto":
        import tensorflow as tf

        return not tf.config.list_physical_devices("GPU")
    return True


@dataclasses.dataclass(frozen=True)
class ExchangePlan:
    """What carries the gradients inside a node and across nodes.

    Attributes:
        shared_memory: the node phases run through a ``/dev/shm`` segment.
        inside: the transport inside a node ("" when each node has one process).
        across: the transport across nodes ("" for a job on one node).
        note: why shared memory was not taken although the mode allowed it ("" otherwise).
    """

    shared_memory: bool
    inside: str
    across: str
    note: str = ""

    def describe(self) -> str:
        """One line: ``inside a node: shared memory; across nodes: Horovod (MPI)``."""
        parts = [f"inside a node: {self.inside}" if self.inside else "",
                 f"across nodes: {self.across}" if self.across else ""]
        text = "; ".join(p for p in parts if p) or "one process: nothing to exchange"
        return f"{text} ({self.note})" if self.note else text


def split_domains(nodes: Sequence[Sequence[int]], domains: Sequence[str]) -> str:
    """Which node of ``nodes`` (each a list of global ranks) spans several shared-memory
    domains, as a sentence; "" when every node is one domain."""
    for index, node in enumerate(nodes):
        seen = {domains[r] for r in node}
        if len(seen) > 1:
            return (f"node {index} of the launcher's layout (ranks {list(node)}) spans "
                    f"{len(seen)} different /dev/shm (separate machines or namespaces whose "
                    "host names are equal)")
    return ""


def plan_exchange(mode: str, nodes: Sequence[Sequence[int]], domains: Sequence[str],
                  transport: str) -> ExchangePlan:
    """The exchange for a job laid out as ``nodes`` (each node's global ranks, as the launcher
    groups them), given every rank's :func:`shm_domain`.

    Args:
        mode: ``--node_exchange``: "auto", "shared_memory" or "collectives".
        nodes: the ranks of each node.
        domains: every rank's shared-memory domain, by rank.
        transport: the strategy's own transport, e.g. "Horovod (MPI)" or "gRPC".

    Raises:
        ValueError: for "shared_memory" where it cannot work (this machine, or a node that
            spans several domains), saying why.
    """
    local_size = min(len(node) for node in nodes)
    across = transport if len(nodes) > 1 else ""
    if not use_shared_memory(mode, local_size):
        return ExchangePlan(False, transport if local_size > 1 else "", across)
    split = split_domains(nodes, domains)
    if split:
        decline(mode, f"{split} (or give such nodes distinct host names)")
    if split:
        return ExchangePlan(False, transport, across, f"no shared memory: {split}")
    return ExchangePlan(True, SHARED_MEMORY, across)


# ``--node_exchange``: of every strategy whose processes exchange gradients inside a node
# (horovod, ddl, multiworker), declared once so that they share one flag.
NODE_EXCHANGE = Option(
    "node_exchange", "auto",
    "horovod, ddl, multiworker: how the processes of one node exchange gradients. "
    "shared_memory: through a /dev/shm segment (x86-64, CPU workers): the whole all-reduce for "
    "horovod and multiworker when every worker is on one node, else the node phases of a "
    "hierarchical all-reduce whose cross-node phase takes the strategy's own transport; "
    "collectives: the strategy's own transport (Horovod's Gloo/MPI, TensorFlow's gRPC ring). "
    "auto: shared_memory where it applies (CPU-only x86-64 workers, several per node; "
    "multiworker also needs as many workers on every node), else collectives. "
    "--ddl_node_exchange is the old name.",
    choices=MODES)
