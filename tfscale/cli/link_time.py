"""Times the exchange's calls across nodes and writes them into a machine file.

``tfscale.forecast --calibrate`` measures one node; what a step pays across the network in a
given shape it cannot time there. Started as one process per rank under the job's own
launcher, on the nodes and ranks per node the training will use, this command times two calls
at the model's gradient bytes, each as a training step makes it:

- ``inter_node.flat_calls``: Horovod's grouped all-reduce over every rank (the gradient list
  in ``--tensors`` tensors, through Horovod's fusion buffer, over MPI or Gloo as Horovod was
  started): the call of horovod's and ddl's flat exchange (``--node_exchange=collectives``);
- ``inter_node.hierarchical_calls``: multiworker's whole hierarchical exchange, tfscale's
  shared-memory node phases around one tfscale ring per local index in one compiled function,
  its sum checked before it is timed (Horovod only gathers the ring's addresses).

Each is nccl-tests' bus bandwidth of one call over all the ranks (bytes / time x 2(n-1)/n),
the unit the forecast charges (docs/FORECAST.md, "A flat call timed in its own shape"). Rank 0
adds both, for this shape (nodes x ranks per node), to a copy of ``--machine`` written to
``--out`` (an entry of the same shape is replaced), and prints one JSON line::

    srun -N2 --ntasks-per-node=2 --mpi=pmix python -m tfscale.cli.link_time \\
        --machine=my_node.json --model=resnet50 --out=my_cluster.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import socket
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

#: Tensors in the flat call's gradient list where ``--tensors`` is not given: between mlp's 6
#: gradients and resnet50's 161; Horovod's copies through its fusion buffer cost per byte,
#: whatever the count (bench.shaped_links times its grouped calls the same way).
TENSORS = 8


def timed(call: Callable[[], object], barrier: Callable[[], object], seconds: float,
          name: str) -> float:
    """Seconds per call: a warm-up, a barrier, then as many calls as fit ``seconds`` (at least
    3, at most 200; every rank makes as many, because rank 0's count is agreed first)."""
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    call()
    barrier()
    start = time.perf_counter()
    call()
    first = time.perf_counter() - start
    wanted = np.array([max(3, min(200, int(seconds / max(first, 1e-6))))], np.int32)
    repeats = int(hvd.broadcast(tf.constant(wanted), 0, name=f"repeats-{name}")[0])
    barrier()
    start = time.perf_counter()
    for _ in range(repeats):
        call()
    return (time.perf_counter() - start) / repeats


def hierarchical_reducer() -> tuple[Callable[[Any], Callable[[], object]],
                                    Callable[[], object]]:
    """(reducer, close): ``reducer(values)`` gives a call of multiworker's exchange across
    nodes on ``values`` (float32, NumPy), built from the pieces
    :mod:`tfscale.strategies.multiworker` builds it from (its ring across nodes,
    :func:`~tfscale.exchange.cross_node.open_cross_node_ring`; transient, as for gradients),
    Horovod standing in for the strategy's own collective while setting up. The first value
    of its sum is checked once, on every rank, before the call is handed out.

    Raises:
        RuntimeError: when the sum is wrong (a timing of it would time nothing).
    """
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    from tfscale.exchange.cross_node import cross_node_sum, open_cross_node_ring
    from tfscale.exchange.hierarchical import HierarchicalAllReduce
    from tfscale.exchange.setup import transient
    from tfscale.exchange.shared_memory import SharedMemoryGroup
    from tfscale.exchange.topology import Topology

    topology = Topology.from_placement(
        hvd.allgather_object((hvd.cross_rank(), hvd.local_rank())), hvd.rank())
    token = int(hvd.broadcast(tf.constant(np.random.randint(1, 2**31)), 0, name="token"))
    node = SharedMemoryGroup(f"linktime{token}", topology.local_index, topology.local_size,
                             ranks=topology.nodes[topology.node_index])
    ring = open_cross_node_ring(
        topology, hvd.allgather_object(socket.gethostname()), token,
        lambda values: hvd.allreduce(tf.constant(values), op=hvd.Sum, name="ports").numpy(),
        120.0)
    reduce = transient(HierarchicalAllReduce.with_cross_sum(
        node, topology, cross_node_sum(ring), "tfscale.link_time.hierarchical"))

    def reducer(values: Any) -> Callable[[], object]:
        tensor = tf.constant(values)
        call = tf.function(lambda: reduce.sum([tensor])[0][:1])
        summed, expected = float(call().numpy()[0]), float(values[0]) * hvd.size()
        if summed != expected:
            raise RuntimeError(f"multiworker's hierarchical exchange: {values.nbytes} bytes "
                               f"summed over {hvd.size()} ranks gave {summed:g}, expected "
                               f"{expected:g}")
        return lambda: call().numpy()

    return reducer, ring.close


def grouped_reducer(tensors: int) -> Callable[[Any], Callable[[], object]]:
    """``reducer(values)``: a call of Horovod's grouped all-reduce (a sum) of ``values``
    split into ``tensors`` tensors, every value read back, as a step hands Horovod its
    gradient list."""
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    def reducer(values: Any) -> Callable[[], object]:
        parts = [tf.constant(part) for part in np.array_split(values, tensors)]
        return lambda: [t.numpy() for t in hvd.grouped_allreduce(
            parts, op=hvd.Sum, name=f"g{values.size}x{tensors}")]

    return reducer


def busbw_GBps(nbytes: int, seconds: float, ranks: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce of ``nbytes`` over ``ranks`` in
    ``seconds``."""
    return nbytes / seconds * 2 * (ranks - 1) / ranks / 1e9


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machine", required=True,
                        help="machine file (or preset) whose model entry gives the gradient "
                             "bytes, and which --out copies")
    parser.add_argument("--model", required=True, help="model whose gradient bytes are timed")
    parser.add_argument("--out", required=True, type=Path,
                        help="machine file written (updated where it exists)")
    parser.add_argument("--seconds", type=float, default=3.0, help="each call is timed for")
    parser.add_argument("--tensors", type=int, default=TENSORS,
                        help="tensors in the flat call's gradient list (the model's gradient "
                             f"count; default {TENSORS})")
    args = parser.parse_args(argv)
    if not args.seconds > 0 or args.tensors < 1:
        parser.error(f"--seconds={args.seconds:g} --tensors={args.tensors}: expected a "
                     "positive time and at least one tensor")
    from tfscale.forecast import machines

    # Everything the write needs is checked before minutes of timing, on every rank.
    try:
        args.gradient_bytes = int(machines.load(args.machine).model(args.model).gradient_bytes)
    except ValueError as error:
        parser.error(f"--machine={args.machine} --model={args.model}: {error}")
    if not args.out.parent.is_dir():
        parser.error(f"--out={args.out}: its folder {args.out.parent} does not exist")
    if args.out.exists():
        try:  # the file it updates (calibrate.write_calls)
            machines.load(str(args.out))
        except ValueError as error:
            parser.error(f"--out={args.out} exists and is not a machine file to update: "
                         f"{error}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = _arguments(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from tfscale.cli import command

    command.import_tensorflow()
    import horovod.tensorflow as hvd
    import numpy as np
    import tensorflow as tf

    hvd.init()
    nodes, local, ranks = hvd.cross_size(), hvd.local_size(), hvd.size()
    if nodes < 2 or ranks != nodes * local:
        if hvd.rank() == 0:
            print(f"tfscale.cli.link_time: {ranks} ranks on {nodes} node(s), {local} on this "
                  "one: it times calls across the network, so start it on 2 or more nodes "
                  "with the same ranks on each (e.g. srun -N2 --ntasks-per-node=2 "
                  "--mpi=pmix python -m tfscale.cli.link_time ...)", file=sys.stderr)
        return 2
    barrier: Callable[[], object] = lambda: hvd.allreduce(tf.zeros(1), name="barrier").numpy()  # noqa: E731
    # Whole float32 values, split evenly over the tensors (the model's bytes, rounded down).
    values = np.ones(args.gradient_bytes // 4 // args.tensors * args.tensors, np.float32)
    flat_s = timed(grouped_reducer(args.tensors)(values), barrier, args.seconds, "flat")
    whole, close = hierarchical_reducer()
    hierarchical_s = timed(whole(values), barrier, args.seconds, "hierarchical")
    barrier()  # every rank is done with the ring before any closes it
    close()
    if hvd.rank() == 0:
        transport = "MPI" if hvd.mpi_enabled() else "Gloo"
        when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
        shape = f"{nodes} nodes x {local} ranks"
        where = f"python -m tfscale.cli.link_time, {when}, from {platform.node()}, {shape}"
        calls = {
            "flat_calls": {
                "nodes": nodes, "ranks_per_node": local,
                "busbw_GBps": busbw_GBps(values.nbytes, flat_s, ranks),
                "source": (f"{where}: Horovod's grouped all-reduce ({transport}) of "
                           f"{args.model}'s {values.nbytes} gradient bytes in {args.tensors} "
                           f"tensors, {flat_s * 1e3:.2f} ms a call")},
            "hierarchical_calls": {
                "nodes": nodes, "ranks_per_node": local,
                "busbw_GBps": busbw_GBps(values.nbytes, hierarchical_s, ranks),
                "source": (f"{where}: multiworker's hierarchical exchange (shared-memory node "
                           f"phases, tfscale's rings across) of {args.model}'s "
                           f"{values.nbytes} gradient bytes, {hierarchical_s * 1e3:.2f} ms a "
                           "call")}}
        from tfscale.forecast import calibrate

        calibrate.write_calls(args.machine, args.out, calls)
        print(json.dumps({"out": str(args.out), "nodes": nodes, "ranks_per_node": local,
                          "bytes": values.nbytes, "flat_ms": flat_s * 1e3,
                          "hierarchical_ms": hierarchical_s * 1e3,
                          **{key: entry["busbw_GBps"] for key, entry in calls.items()}}))
    sys.stdout.flush()
    barrier()
    return 0


if __name__ == "__main__":
    sys.exit(main())
