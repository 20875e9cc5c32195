"""One rank of bench.shaped_links' link measurement, started by ``srun --mpi=pmix``.

With one rank per node it times Horovod's all-reduce (MPI, the transport tfscale's strategies
take across nodes) of one float32 tensor per size; with every rank on one node it times
tfscale's shared-memory node exchange instead (the in-node phase of the hierarchical
all-reduce), or, with ``--horovod``, Horovod's all-reduce there too (Open MPI's shared memory:
the in-node hops of a flat ring over every rank). With ``--float16`` Horovod's all-reduces
carry float16 (what ``--fp16_allreduce`` sends: half the bytes, but its sums are Horovod's own
float16 reduction, not MPI's); sizes are then the float16 bytes. With ``--ring`` it times
tfscale's own ring across the nodes instead (multiworker's hierarchical cross phase:
:mod:`tfscale.exchange.socket_ring`), Horovod only gathering its ports: with L ranks on each
node, L rings at once, one among the ranks of each local index, as that phase runs them, each
ring's bus bandwidth over its own members (``"rings": L``). With ``--hierarchical`` it times
multiworker's whole hierarchical exchange as its training step calls it: tfscale's
shared-memory node phases as TensorFlow ops around one ring per local index (a
``tf.numpy_function``), in one compiled function, its result left in TensorFlow's memory (one
value read back), each call's bus bandwidth over every rank of the job. With
``--grouped=K`` (Horovod across nodes) each size is split into K tensors and reduced by one
``hvd.grouped_allreduce``: the call a run whose strategy hands Horovod its gradient list makes,
with Horovod's copies into its fusion buffer and back, which one tensor does not make (MPI
reduces it in place of its output). Rank 0 prints one JSON line: seconds per call for each size
in bytes, the bus bandwidth of each (nccl-tests' definition, bytes / time x 2(n-1)/n) and the
small-message time. ``--seconds=S`` (default 2): how long each size is timed for (at least 3
calls, at most 200).
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfscale.cli.link_time import (  # noqa: E402
    busbw_GBps,
    grouped_reducer,
    hierarchical_reducer,
    timed,
)

SIZES_MB = (1, 4, 16, 64)
SMALL_BYTES = 4  # one float32: the time of a call is its latency


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--horovod", action="store_true")
    parser.add_argument("--ring", action="store_true")
    parser.add_argument("--hierarchical", action="store_true")
    parser.add_argument("--float16", action="store_true")
    parser.add_argument("--grouped", type=int, default=1, metavar="K")
    parser.add_argument("--seconds", type=float, default=2.0, metavar="S")
    args = parser.parse_args()
    if args.grouped < 1 or not args.seconds > 0:
        parser.error(f"--grouped={args.grouped} --seconds={args.seconds:g}: expected a number "
                     "of tensors >= 1 and a positive time")
    return args


def main() -> None:
    args = _arguments()
    grouped = args.grouped
    hvd.init()
    n = hvd.size()
    peers = n  # the ranks each call's bus bandwidth is over: under --ring, its ring's own
    one_node = hvd.cross_size() == 1 and not args.horovod
    barrier: Callable[[], object] = lambda: hvd.allreduce(tf.zeros(1), name="barrier").numpy()  # noqa: E731
    close: Callable[[], object] = lambda: None  # noqa: E731
    if one_node:
        from tfscale.exchange.shared_memory import SharedMemoryGroup

        node = SharedMemoryGroup(f"bench{os.environ.get('SLURM_JOB_ID', os.getpid())}",
                            hvd.local_rank(), hvd.local_size())
        transport = "shared memory"

        def reducer(values: np.ndarray) -> Callable[[], object]:
            return lambda: node.all_reduce(values, copy=False)
    elif args.hierarchical:
        transport = "shared memory and tfscale's rings (multiworker's hierarchical exchange)"
        whole, close = hierarchical_reducer()

        def reducer(values: np.ndarray) -> Callable[[], object]:
            return whole(values)
    elif args.ring:
        from tfscale.exchange.cross_node import TRANSPORT as transport
        from tfscale.exchange.socket_ring import open_ring

        token = int(hvd.broadcast(tf.constant(np.random.randint(1, 2**31)), 0, name="token"))
        local_ranks = hvd.allgather_object(hvd.local_rank())
        members = [r for r in range(n) if local_ranks[r] == hvd.local_rank()]
        ring = open_ring(hvd.rank(), members, hvd.allgather_object(socket.gethostname()),
                         token, hvd.allgather_object, timeout_s=120.0)
        close = ring.close
        peers = len(members)

        def reducer(values: np.ndarray) -> Callable[[], object]:
            return lambda: ring.all_reduce(values)
    elif grouped > 1:
        transport = "Horovod (MPI), grouped" if hvd.mpi_enabled() else "Horovod (Gloo), grouped"
        group = grouped_reducer(grouped)

        def reducer(values: np.ndarray) -> Callable[[], object]:
            return group(values)
    else:
        transport = "Horovod (MPI)" if hvd.mpi_enabled() else "Horovod (Gloo)"

        def reducer(values: np.ndarray) -> Callable[[], object]:
            tensor = tf.constant(values)
            return lambda: hvd.allreduce(tensor, op=hvd.Sum, name=f"v{values.size}").numpy()

    dtype = np.float16 if args.float16 and not one_node else np.float32
    rows = []
    for nbytes in (SMALL_BYTES, *(mb * 2**20 for mb in SIZES_MB)):
        values = np.ones(nbytes // np.dtype(dtype).itemsize, dtype)
        per_call = timed(reducer(values), barrier, args.seconds, str(nbytes))
        rows.append({"bytes": nbytes, "seconds": per_call,
                     "busbw_GBps": busbw_GBps(nbytes, per_call, peers)})
    if hvd.rank() == 0:
        print(json.dumps({"ranks": hvd.size(), "nodes": hvd.cross_size(),
                          "rings": n // peers, "transport": transport,
                          "dtype": np.dtype(dtype).name, "tensors": grouped,
                          "small_message_us": rows[0]["seconds"] * 1e6, "sizes": rows[1:]}))
    sys.stdout.flush()
    barrier()  # every rank is done with the ring before any closes it
    close()


if __name__ == "__main__":
    main()
