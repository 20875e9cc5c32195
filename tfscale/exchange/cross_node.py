"""The cross-node exchange of a ``tf.distribute`` cluster: TensorFlow's collective sum among the
processes with one local index, over the cluster's gRPC (the hierarchical all-reduce's second
phase under ``multiworker``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tfscale.exchange.topology import Topology

# TF collective group keys of the cross-node phase, one per local index, far above those
# that tf.distribute allocates from 1 upwards.
CROSS_GROUP_KEY = 0x3A000000
CROSS_INSTANCE_KEY = 0x3B000000


def tf_cross_node_sum(topology: Topology, timeout_s: float = 0.0) -> Callable[[Any, str], Any]:
    """Phase 2 in a ``tf.distribute`` cluster (MultiWorkerMirroredStrategy's workers): a TF
    collective sum among the processes with this process's local index, one per node, over
    the cluster's own transport (gRPC). Each local index is a group of its own, keyed by it;
    each call site (its tag) an instance of its own, the same on every process.

    Args:
        topology: the job's nodes.
        timeout_s: a call's timeout (0: none; the strategy's own peer checks stop a job whose
            peer died).
    """
    import zlib

    import tensorflow as tf

    group_key = CROSS_GROUP_KEY + topology.local_index

    def cross_sum(chunk: Any, tag: str) -> Any:
        return tf.raw_ops.CollectiveReduceV2(
            input=chunk, group_size=topology.num_nodes, group_key=group_key,
            instance_key=CROSS_INSTANCE_KEY + zlib.crc32(tag.encode()) % 0x1000000,
            ordering_token=[], merge_op="Add", final_op="Id", communication_hint="ring",
            timeout_seconds=float(timeout_s))

    return cross_sum
