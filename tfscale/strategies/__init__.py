"""Distribution strategies: a registry of :class:`Strategy` plugins."""

from tfscale.strategies.base import SingleProcessStrategy, Strategy, running
from tfscale.strategies.ddl import DDLStrategy
from tfscale.strategies.default import DefaultStrategy
from tfscale.strategies.horovod import HorovodStrategy
from tfscale.strategies.mirrored import MirroredStrategy
from tfscale.strategies.multiworker import MultiWorkerStrategy
from tfscale.strategies.registry import STRATEGIES, create, load_plugins, register

register("default", DefaultStrategy, "one process, one device")
register("mirrored", MirroredStrategy,
         "tf.distribute.MirroredStrategy: one process, a replica per GPU (or --cpu_replicas)")
register("multiworker", MultiWorkerStrategy,
         "tf.distribute.MultiWorkerMirroredStrategy: a process per worker (TF_CONFIG/Slurm)")
register("horovod", HorovodStrategy,
         "Horovod: one process per replica, fused all-reduce of gradients (Gloo or MPI)")
register("ddl", DDLStrategy,
         "IBM DDL's model on Horovod: hierarchical all-reduce over nodes, DDL callbacks")

__all__ = ["STRATEGIES", "SingleProcessStrategy", "Strategy", "create", "load_plugins",
           "register", "running"]
