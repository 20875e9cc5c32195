"""The cross-node exchange of a ``tf.distribute`` cluster (the hierarchical all-reduce's second
phase under ``multiworker``): a ring over TCP among the processes with one local index, one
per node (:mod:`tfscale.exchange.socket_ring`), as a TensorFlow op."""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from tfscale.exchange import placement
from tfscale.exchange.socket_ring import SocketRing, open_ring
from tfscale.exchange.topology import Topology

#: What carries the phase, as the exchange plan names it.
TRANSPORT = "TCP (tfscale's ring)"


def open_cross_node_ring(topology: Topology, hosts: Sequence[str], token: int,
                         sum_all: Callable[[np.ndarray], np.ndarray],
                         timeout_s: float) -> SocketRing:
    """This process's ring among the job's processes with its local index (one per node); a
    collective of the whole job.

    Args:
        topology: the job's nodes (two or more).
        hosts: every rank's host, by rank (TF_CONFIG's worker addresses).
        token: the same on every process, new for the job.
        sum_all: the element-wise sum of a float64 vector over all processes (the strategy's
            own collective), which gathers the rings' ports.
        timeout_s: how long to wait for a peer (0: 600 s).
    """
    def all_ports(port: int) -> list[int]:
        return [int(p) for p in placement.gather_strings(str(port), topology.rank,
                                                         topology.size, sum_all)]

    return open_ring(topology.rank, topology.cross_ranks, hosts, token, all_ports,
                     timeout_s or 600.0)


def cross_node_sum(ring: SocketRing) -> Callable[[Any, str], Any]:
    """Phase 2 as a TensorFlow op: ``cross_sum(chunk, tag)``, the sum of ``chunk`` over the
    ring. Calls are ordered as the step's stateful ops are; ``tag`` names the call site, the
    same on every process."""
    import tensorflow as tf

    def cross_sum(chunk: Any, tag: str) -> Any:
        out = tf.numpy_function(functools.partial(ring.all_reduce, tag=tag), [chunk],
                                chunk.dtype, stateful=True,
                                name=re.sub(r"[^A-Za-z0-9_]", "_", tag) + "_cross_node")
        return tf.ensure_shape(out, chunk.shape)

    return cross_sum
