"""Distribution strategies: a registry of :class:`Strategy` plugins."""

from tfscale.strategies.base import Rendezvous, SingleProcessStrategy, Strategy, running
from tfscale.strategies.ddl import DDL_STRATEGY, DDLStrategy
from tfscale.strategies.default import DEFAULT_STRATEGY, DefaultStrategy
from tfscale.strategies.horovod import HorovodStrategy
from tfscale.strategies.mirrored import MirroredStrategy
from tfscale.strategies.multiworker import MultiWorkerStrategy
from tfscale.strategies.registry import (
    STRATEGIES,
    check_config,
    create,
    load_plugins,
    register,
    strategies_that,
    unread_flags,
)

#: What several workers started without a ``--strategy`` use (``tfscale-run --nproc N``).
MULTI_PROCESS_DEFAULT = "horovod"

register(DEFAULT_STRATEGY, DefaultStrategy, "one process, one device")
register("mirrored", MirroredStrategy,
         "tf.distribute.MirroredStrategy: one process, a replica per GPU (or --cpu_replicas)")
register("multiworker", MultiWorkerStrategy,
         "tf.distribute.MultiWorkerMirroredStrategy: a process per worker (TF_CONFIG/Slurm)")
register("horovod", HorovodStrategy,
         "Horovod: one process per replica, fused all-reduce of gradients (Gloo or MPI)")
register(DDL_STRATEGY, DDLStrategy,
         "IBM DDL's model on Horovod: hierarchical all-reduce over nodes, DDL callbacks")

__all__ = ["DDL_STRATEGY", "DEFAULT_STRATEGY", "MULTI_PROCESS_DEFAULT", "STRATEGIES", "Rendezvous",
           "SingleProcessStrategy", "Strategy", "check_config", "create", "load_plugins",
           "register", "running", "strategies_that", "unread_flags"]
