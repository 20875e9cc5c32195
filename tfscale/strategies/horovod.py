"""The ``horovod`` strategy: one process per replica on Horovod's TensorFlow ops.

Horovod's own Keras layer does not support Keras 3; the strategy uses tfscale's collectives layer
(:mod:`tfscale.exchange`, the same code users' scripts reach through :mod:`tfscale.horovod`):

- gradients are averaged by one ``grouped_allreduce`` (Horovod fuses the group into few
  buffers: tensor fusion; it sums the gradients of a loss divided by the workers) inside the
  optimizer's ``apply``, which Keras 3 traces into the training function
  (:func:`tfscale.exchange.optimizer.horovod_allreduce`); when every rank runs on one CPU-only
  x86-64 node, through a shared-memory segment instead (``--node_exchange``,
  :mod:`tfscale.exchange.shared_memory`): Gloo carries a node's exchange over loopback TCP,
  four times slower for an ``mlp``'s 7.4 MB (bench/RESULTS.md);
- initial weights and optimizer state are broadcast from rank 0;
- logged metrics are averaged across workers at the end of each epoch.

Horovod is imported lazily so that the other strategies work without it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from tfscale.cluster import environment as cluster_env
from tfscale.config.options import Option
from tfscale.exchange import sharded_update
from tfscale.exchange.hierarchical import HierarchicalAllReduce
from tfscale.exchange.horovod_runtime import HorovodCollectives, check_installed, start_horovod
from tfscale.exchange.horovod_timeline import TIMELINE_FILE
from tfscale.exchange.optimizer import (
    horovod_allreduce,
    horovod_summed,
    with_gradient_reduction,
)
from tfscale.exchange.placement import NODE_EXCHANGE
from tfscale.exchange.setup import (
    CPU_CYCLE_TIME_MS,
    SHARED_MEMORY_CYCLE_TIME_MS,
    horovod_reduction,
    one_node_shared_memory,
    transient,
)
from tfscale.exchange.sharded_update import SHARDED_UPDATE
from tfscale.strategies.base import Rendezvous, Strategy

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from tfscale.config.settings import StrategySettings

# Where --horovod_autotune writes, in the model_dir (--horovod_timeline: TIMELINE_FILE).
AUTOTUNE_FILE = "horovod_autotune.csv"

# Horovod's knobs: performance only, so another strategy given them warns and goes on.
FP16_ALLREDUCE = Option("fp16_allreduce", False,
                        "Horovod: compress gradients to float16 for the all-reduce.",
                        tuning=True)
FUSION_THRESHOLD_MB = Option("fusion_threshold_mb", -1.0,
                             "Horovod tensor-fusion buffer in MiB (-1 = Horovod's default).",
                             tuning=True)
CYCLE_TIME_MS = Option(
    "cycle_time_ms", -1.0,
    "Horovod cycle time in ms. -1: HOROVOD_CYCLE_TIME if set, else, on workers without a GPU "
    "(Horovod's 1 ms wake-ups slow CPU steps), 50 ms when all ranks run on one node and exchange "
    "through shared memory (Horovod then carries no collective during training) and 5 ms "
    "otherwise, unless --sync_bn (whose per-layer sums each wait for a cycle); else Horovod's "
    "default.", tuning=True)
HOROVOD_TIMELINE = Option(
    "horovod_timeline", False,
    f"Write Horovod's timeline of every collective (negotiation, fusion, all-reduce) to "
    f"MODEL_DIR/{TIMELINE_FILE}, for chrome://tracing or Perfetto. Horovod strategies only; "
    "with --node_exchange=auto the gradients then go through Horovod, not shared memory, so "
    "that the timeline shows them.", tuning=True)
HOROVOD_AUTOTUNE = Option(
    "horovod_autotune", False,
    "Let Horovod's autotuner search the fusion buffer, cycle time and hierarchical settings "
    f"while training; each setting tried and its score go to MODEL_DIR/{AUTOTUNE_FILE}. "
    "Horovod strategies only; with --node_exchange=auto the gradients then go through Horovod, "
    "whose settings it tunes.", tuning=True)


def gpu_for_local_rank(local_rank: int, num_gpus: int) -> int | None:
    """Index of the GPU a process of ``local_rank`` uses among the ``num_gpus`` it sees.

    ``None`` when it sees none (CPU) or one (the launcher already chose it, e.g. jsrun's resource
    sets or ``CUDA_VISIBLE_DEVICES`` set per rank).

    Raises:
        ValueError: when a node runs more processes than it has GPUs.
    """
    if num_gpus <= 1:
        return None
    if local_rank >= num_gpus:
        raise ValueError(
            f"local rank {local_rank} has no GPU of its own: this node shows {num_gpus} GPUs; "
            "start one process per GPU (tasks per node = GPUs per node)"
        )
    return local_rank


def _has_gpu() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


def pin_gpu(local_rank: int) -> None:
    """Makes only this local rank's GPU visible to TensorFlow, with memory growth on."""
    import tensorflow as tf

    gpus = tf.config.list_physical_devices("GPU")
    index = gpu_for_local_rank(local_rank, len(gpus))
    if index is None:
        return
    tf.config.experimental.set_memory_growth(gpus[index], True)
    tf.config.set_visible_devices(gpus[index], "GPU")


class HorovodStrategy(Strategy):
    """Horovod: one process per replica, fused all-reduce of gradients (Gloo or MPI).

    Attributes:
        reduce: the gradients' all-reduce when it is not Horovod's ``grouped_allreduce``
            (shared memory on one node; ddl's hierarchical one), else None.
        exchange_plan: what carries the gradients inside and across nodes (set up by
            :meth:`gradient_reduction`).
    """

    reduce: HierarchicalAllReduce | None = None
    # Set by apply_environment: it chose the shared-memory cycle time.
    _long_cycle = False

    rendezvous = Rendezvous.HOROVOD
    # Horovod's XLA ops are left out of the build (see BUILD.md), so the all-reduce cannot be
    # inside an XLA-compiled training step: --xla=jit compiles the model's passes only.
    _jit_scope = "model"
    one_rank_per_gpu = True
    # The lag lives in the optimizer's gradient exchange, which only these strategies own;
    # tf.distribute's all-reduce runs inside Keras's step, where it cannot be deferred.
    owned_flags: ClassVar[tuple[str, ...]] = ("gradient_lag",)
    options: ClassVar[tuple[Option[Any], ...]] = (
        NODE_EXCHANGE, SHARDED_UPDATE, FP16_ALLREDUCE, FUSION_THRESHOLD_MB, CYCLE_TIME_MS,
        HOROVOD_TIMELINE, HOROVOD_AUTOTUNE)

    @classmethod
    def environment(cls, config: StrategySettings) -> dict[str, str]:
        """Horovod's variables for the config's communication flags (the only place they are
        built: job scripts export them, ``setup`` applies them)."""
        env: dict[str, str] = {}
        fusion_mb, cycle_ms = FUSION_THRESHOLD_MB.of(config), CYCLE_TIME_MS.of(config)
        if fusion_mb >= 0:
            env["HOROVOD_FUSION_THRESHOLD"] = str(int(fusion_mb * 1024 * 1024))
        if cycle_ms >= 0:
            env["HOROVOD_CYCLE_TIME"] = f"{cycle_ms:g}"
        if config.collective_timeout_s:
            # A rank that stops submitting tensors (stuck or dead) shuts the job down instead
            # of hanging it; Gloo's own socket timeout covers a peer that vanishes mid-transfer.
            timeout = max(2, int(config.collective_timeout_s))
            env["HOROVOD_STALL_CHECK_TIME_SECONDS"] = str(max(1, timeout // 2))
            env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = str(timeout)
            env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(timeout)
        if HOROVOD_TIMELINE.of(config):
            env["HOROVOD_TIMELINE"] = os.path.join(config.model_dir, TIMELINE_FILE)
        if HOROVOD_AUTOTUNE.of(config):
            env["HOROVOD_AUTOTUNE"] = "1"
            env["HOROVOD_AUTOTUNE_LOG"] = os.path.join(config.model_dir, AUTOTUNE_FILE)
        return env

    @classmethod
    def check_environment(cls) -> None:
        try:
            check_installed()  # not imported: the launcher's process stays without TensorFlow
        except RuntimeError as err:
            raise ValueError(str(err)) from None

    def setup(self) -> None:
        self.apply_environment()
        if self._several_nodes() and self.node_exchange_mode() != "collectives":
            # The exchange may be hierarchical (shared memory inside each node, Horovod across):
            # its process sets are registered once the nodes are known.
            start_horovod()
        self.comm = HorovodCollectives()
        self._check_size()
        pin_gpu(self.local_rank)
        self.reduce = self.gradient_reduction()
        self._check_long_cycle()

    def gradient_reduction(self) -> HierarchicalAllReduce | None:
        """The gradients' all-reduce when it is not Horovod's ``grouped_allreduce``
        (:func:`tfscale.exchange.setup.horovod_reduction`, which users' scripts share),
        set up for this run's ``--fp16_allreduce``. A collective (every rank must call it).

        Raises:
            ValueError: for ``--node_exchange=shared_memory`` where it cannot run.
        """
        reduce, self.exchange_plan = horovod_reduction(
            self.comm.hvd, self.rank, self.size, self.node_exchange_mode(),
            self.config.collective_timeout_s)
        if reduce is None:
            return None
        # Transient: the optimizer applies the reduced gradients within the step.
        return transient(reduce, FP16_ALLREDUCE.of(self.config), "tfscale.horovod")

    def _several_nodes(self) -> bool:
        """Whether, by the launcher's variables, the ranks of this job span several nodes."""
        env = cluster_env.this_process()
        return env.local_size < env.size

    def apply_environment(self) -> None:
        """Sets :meth:`environment`'s variables, and Horovod's cycle time for CPU training
        when neither ``--cycle_time_ms`` nor ``HOROVOD_CYCLE_TIME`` says otherwise and
        ``--sync_bn`` is off (call before Horovod starts: it reads them once). Creates the
        model directory where the timeline or autotune log goes: Horovod opens them in
        ``hvd.init()`` and, in a folder that does not exist, warns and writes neither."""
        if HOROVOD_TIMELINE.of(self.config) or HOROVOD_AUTOTUNE.of(self.config):
            os.makedirs(self.config.model_dir, exist_ok=True)
        os.environ.update(self.environment(self.config))
        # Not with --sync_bn: its per-layer sums run one after another, each waiting for a cycle.
        if (CYCLE_TIME_MS.of(self.config) < 0 and "HOROVOD_CYCLE_TIME" not in os.environ
                and not self.config.sync_bn and not _has_gpu()):
            self._long_cycle = self._one_node_shared_memory()
            cycle = SHARED_MEMORY_CYCLE_TIME_MS if self._long_cycle else CPU_CYCLE_TIME_MS
            os.environ["HOROVOD_CYCLE_TIME"] = f"{cycle:g}"

    def _one_node_shared_memory(self) -> bool:
        """Whether, by the launcher's variables, every rank runs on this node (no
        ``--ddl_local_size`` groups) and ``--node_exchange`` will take shared memory: then
        Horovod carries only start-up collectives."""
        groups = self._node_group_size()
        if 0 < groups < cluster_env.this_process().size:
            return False
        return one_node_shared_memory(self.node_exchange_mode())

    def _node_group_size(self) -> int:
        """Processes per node when the strategy regroups the ranks itself (0: it does not)."""
        return 0

    def node_exchange_mode(self) -> str:
        """``--node_exchange``, where ``auto`` keeps Horovod's transport when Horovod's timeline
        or autotuner is on: they record and tune Horovod's collectives, and shared memory would
        leave Horovod none during training."""
        config = self.config
        mode = NODE_EXCHANGE.of(config)
        if mode == "auto" and (HOROVOD_TIMELINE.of(config) or HOROVOD_AUTOTUNE.of(config)):
            return "collectives"
        return mode

    def _check_long_cycle(self) -> None:
        """Warns when the long cycle was chosen for a job that Horovod carries after all."""
        if (self._long_cycle
                and (self.reduce is None or not self.reduce.one_node_shared_memory)):
            warnings.warn(
                f"Horovod's cycle time was set to {SHARED_MEMORY_CYCLE_TIME_MS:g} ms for a job "
                "on one node that exchanges through shared memory, but Horovod carries this "
                "job's collectives (it found several nodes): each waits up to a cycle; set "
                f"--cycle_time_ms={CPU_CYCLE_TIME_MS:g}", stacklevel=2)

    def _check_size(self) -> None:
        expected = self.config.num_processes
        if expected > 1 and expected != self.comm.size:
            raise ValueError(
                f"--num_processes={expected} but the Horovod job has {self.comm.size} "
                "worker(s); drop --num_processes when starting under horovodrun/mpirun, or "
                "let tfscale launch the workers itself"
            )
        if self.comm.size == 1 and expected == 1 and "HOROVOD_RANK" not in os.environ:
            warnings.warn(
                f"--strategy={self.config.strategy} is running as a single worker; start it with "
                "--num_processes N (or under horovodrun/mpirun) to train on N workers",
                stacklevel=2,
            )

    def teardown(self) -> None:
        if hasattr(self, "comm"):
            self.comm.hvd.shutdown()

    @property
    def rank(self) -> int:
        return self.comm.rank

    @property
    def size(self) -> int:
        return self.comm.size

    @property
    def local_rank(self) -> int:
        return int(self.comm.hvd.local_rank())

    @property
    def local_size(self) -> int:
        return int(self.comm.hvd.local_size())

    def wrap_optimizer(self, optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
        if self.reduce is not None:
            # The mean as a sum of gradients from a loss divided by the workers: the sum skips
            # the pass that a mean's division makes over the gradients (bench/RESULTS.md).
            shard, self.update_sharding = sharded_update.choose(
                SHARDED_UPDATE.of(self.config) and not self.config.gradient_lag, optimizer,
                self.reduce)
            self.sharded_optimizer = optimizer
            return with_gradient_reduction(optimizer, self.reduce,
                                           gradient_lag=self.config.gradient_lag,
                                           summed=self.reduce.sum,
                                           workers=self.reduce.topology.size,
                                           shard_update=shard)
        hvd = self.comm.hvd
        # Horovod's transport, as gradient_reduction chose (not the users' node exchange).
        compression = (hvd.Compression.fp16 if FP16_ALLREDUCE.of(self.config)
                       else hvd.Compression.none)
        # The mean as Horovod's sum of gradients from a loss divided by the workers, as above
        # (except under fp16).
        return with_gradient_reduction(optimizer, horovod_allreduce(hvd, compression=compression),
                                       gradient_lag=self.config.gradient_lag,
                                       summed=horovod_summed(hvd, compression=compression),
                                       workers=self.size)

    def describe(self) -> str:
        return f"{super().describe()}; gradients {self.exchange()}"

    def callbacks(self) -> list[keras.callbacks.Callback]:
        # Imported here: the callbacks load Keras, which reading the class (--help, job
        # scripts) does not need.
        from tfscale.callbacks import BroadcastInitialState, MetricAverage

        return [BroadcastInitialState(self.comm), MetricAverage(self)]

    def all_reduce(self, values: Sequence[float] | np.ndarray, op: str = "mean") -> np.ndarray:
        # On one node with shared memory, host collectives stay off Horovod too, so that
        # Horovod has nothing to do per step (see apply_environment).
        out = None if self.reduce is None else self.reduce.host_all_reduce(values, op)
        return self.comm.all_reduce(values, op) if out is None else out

    def broadcast(self, values: Sequence[float] | np.ndarray, root: int = 0) -> np.ndarray:
        return self.comm.broadcast(values, root)

    def broadcast_variables(self, variables: Sequence[keras.Variable], root: int = 0) -> None:
        self.comm.broadcast_variables(variables, root)

    def replica_sum(self, tensor: tf.Tensor, group_size: int = 0) -> tf.Tensor:
        hvd = self.comm.hvd

        def all_sum(value: tf.Tensor) -> tf.Tensor:
            # Named after the tensor, as Horovod does by default: every rank traces the same
            # graph, so names match across ranks and differ between layers and micro-batches.
            # Horovod registers the gradient: the all-reduce (sum) of the upstream gradients.
            return hvd.allreduce(value, op=hvd.Sum)

        return self._sum_in_groups(all_sum, tensor, self.rank, group_size)
