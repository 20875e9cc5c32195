"""``--node_exchange``: the option of every strategy whose processes exchange gradients inside a
node (horovod, ddl, multiworker), declared once so that they share one flag."""

from __future__ import annotations

from tfscale.collectives.placement import MODES
from tfscale.options import Option

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
