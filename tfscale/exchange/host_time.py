"""One worker of the host-time measurement of multiworker's transports
(``python -m tfscale.cli.host_time``): an all-reduce among the TF_CONFIG workers, through
tfscale's ring as multiworker's cross-node phase calls it (``ring``:
:func:`tfscale.exchange.cross_node.cross_node_sum`) or through TensorFlow's collective over the
cluster's gRPC (``grpc``: what carries multiworker's flat ring, under
``--node_exchange=collectives``), called as Keras calls it in a training step: a list of
gradient tensors handed to the strategy's all-reduce, which packs them into one tensor, sums
it and splits the sum again."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence

TRANSPORTS = ("ring", "grpc")


def tensor_counts(transport: str, nbytes: int, tensors: Sequence[int] = ()) -> list[int]:
    """The element counts of the float32 tensors an all-reduce of ``nbytes`` through
    ``transport`` is timed in: ``tensors`` where given (``grpc`` only: the strategy packs a
    tensor list; the ring's phase takes the step's gradients as one), else one tensor. The
    host-time command checks its ``--tensors`` here before any worker starts.

    Raises:
        ValueError: for ``tensors`` given for ``ring``, or not positive counts that sum to
            ``nbytes`` / 4.
    """
    if tensors and transport != "grpc":
        raise ValueError(f"goes with grpc (the strategy packs a tensor list), not {transport}: "
                         "the ring's phase takes the step's gradients as one tensor")
    counts = list(tensors) or [nbytes // 4]
    if min(counts) < 1 or 4 * sum(counts) != nbytes:
        raise ValueError(f"expected positive whole numbers summing to NBYTES/4 = "
                         f"{nbytes // 4} (float32 values), not {len(counts)} summing to "
                         f"{sum(counts)}")
    return counts


def seconds_per_call(transport: str, nbytes: int, calls: int,
                     tensors: Sequence[int] = ()) -> float:
    """One of the workers TF_CONFIG names (two for ``ring``; any number for ``grpc``, one
    ring over all of them): seconds per all-reduce of ``nbytes`` through ``transport`` over
    ``calls`` calls, after a warm-up call whose sum is checked. ``tensors`` (``grpc``): the
    element counts of the float32 tensors the bytes are in, a model's gradients in the order
    Keras hands them over (their packing and splitting are part of the call); by default one
    tensor.

    Raises:
        ValueError: as :func:`tensor_counts`.
    """
    counts = tensor_counts(transport, nbytes, tensors)
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
    values = [tf.fill([count], float(rank + 1)) for count in counts]
    if transport == "ring":
        hosts = [worker.rsplit(":", 1)[0] for worker in workers]
        ring = cross_node.open_cross_node_ring(
            Topology(((0,), (1,)), rank), hosts, 1,
            lambda values: process_sum(strategy, 2, values), 120.0)
        cross_sum = cross_node.cross_node_sum(ring)

        def summed() -> list[tf.Tensor]:
            return [cross_sum(values[0], "tfscale.exchange.host_time")]
    else:
        def summed() -> list[tf.Tensor]:
            # multiworker's flat exchange: Keras 3's optimizer hands the gradient list to the
            # replica context's all-reduce (tfscale.strategies.keras_multiworker).
            return strategy.run(lambda: tf.distribute.get_replica_context().all_reduce(
                tf.distribute.ReduceOp.SUM, values))

    # The sum stays where a training step keeps it, in TensorFlow's memory: the timed calls
    # read back one value. Reading all of it into NumPy added a host copy that no step makes:
    # 16-22% of resnet50's call (docs/FORECAST.md, "gRPC's host figure as a step calls it").
    once = tf.function(summed)
    timed = tf.function(lambda: summed()[0][:1])

    want = size * (size + 1) / 2
    for got in once():  # warm-up: connections, buffers; the whole sum checked
        ends = got.numpy()[[0, -1]]
        if ends[0] != want or ends[1] != want:
            raise RuntimeError(f"the sum of 1 to {size} came back as {ends[0]}, {ends[1]}")
    timed().numpy()  # its own trace, outside the timing
    start = time.perf_counter()
    for _ in range(calls):
        timed().numpy()
    return (time.perf_counter() - start) / calls
