"""One worker of the host-time measurement of multiworker's transports
(``python -m tfscale.cli.host_time``): an all-reduce among the TF_CONFIG workers, through
tfscale's ring as multiworker's cross-node phase calls it (``ring``:
:func:`tfscale.exchange.cross_node.cross_node_sum`) or through TensorFlow's collective over the
cluster's gRPC (``grpc``: what carries multiworker's flat ring, under
``--node_exchange=collectives``)."""

from __future__ import annotations

import os
import time

TRANSPORTS = ("ring", "grpc")


def seconds_per_call(transport: str, nbytes: int, calls: int) -> float:
    """One of the workers TF_CONFIG names (two for ``ring``; any number for ``grpc``, one
    ring over all of them): seconds per all-reduce of ``nbytes`` through ``transport`` over
    ``calls`` calls, after a warm-up call whose sum is checked."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from tfscale.cluster.environment import parse_tf_config
    from tfscale.exchange import cross_node
    from tfscale.exchange.tf_distribute import process_sum
    from tfscale.exchange.topology import Topology

    tf.config.threading.set_inter_op_parallelism_threads(1)
    tf.config.threading.set_intra_op_parallelism_threads(1)
    # The strategy connects the cluster and configures its collectives, as under multiworker.
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    rank, workers = parse_tf_config(os.environ["TF_CONFIG"])
    size = len(workers)
    if transport == "ring":
        hosts = [worker.rsplit(":", 1)[0] for worker in workers]
        ring = cross_node.open_cross_node_ring(
            Topology(((0,), (1,)), rank), hosts, 1,
            lambda values: process_sum(strategy, 2, values), 120.0)
        cross_sum = cross_node.cross_node_sum(ring)
    else:
        def cross_sum(chunk: tf.Tensor, tag: str) -> tf.Tensor:
            return tf.raw_ops.CollectiveReduceV2(
                input=chunk, group_size=size, group_key=0x3A000000, instance_key=0x3B000000,
                ordering_token=[], merge_op="Add", final_op="Id", communication_hint="ring")
    values = tf.fill([nbytes // 4], float(rank + 1))

    @tf.function
    def once() -> tf.Tensor:
        return cross_sum(values, "tfscale.exchange.host_time")

    @tf.function
    def timed() -> tf.Tensor:
        # The sum stays where training keeps it, in TensorFlow's memory: only its first value
        # comes back. Reading all of it into NumPy added a host copy that no training step
        # makes, 20-30% of resnet50's call (docs/FORECAST.md, "The host figure's read-back").
        return cross_sum(values, "tfscale.exchange.host_time")[:1]

    got = once().numpy()  # warm-up: connections, buffers; the whole sum checked
    if got[0] != size * (size + 1) / 2 or got[-1] != got[0]:
        raise RuntimeError(f"the sum of 1 to {size} came back as {got[0]}, {got[-1]}")
    timed().numpy()  # its own trace, outside the timing
    start = time.perf_counter()
    for _ in range(calls):
        timed().numpy()
    return (time.perf_counter() - start) / calls
