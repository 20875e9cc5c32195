"""The ``horovod`` strategy: one process per replica on Horovod's TensorFlow ops.

Horovod's own Keras layer does not support Keras 3, so tfscale owns the integration:

- gradients are averaged by one ``grouped_allreduce`` (Horovod fuses the group into few
  buffers: tensor fusion) inside the optimizer's ``apply``, which Keras 3 traces into the
  training function;
- initial weights and optimizer state are broadcast from rank 0 (Keras 3 variables are not
  ``tf.Variable``s, their ``.value`` is, so the broadcast goes through that);
- logged metrics are averaged across workers at the end of each epoch.

Horovod is imported lazily so that the other strategies work without it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from tfscale.strategies.base import Strategy

if TYPE_CHECKING:
    import keras

INSTALL_HINT = (
    "Horovod is not importable in this environment. Run `bash launch/setup.sh` (it builds "
    "Horovod 0.28.1 with TensorFlow and Gloo into .venv; see BUILD.md), or pick "
    "--strategy default|mirrored|multiworker."
)
_OPS = ("mean", "sum", "max", "min")


def import_horovod() -> ModuleType:
    """``horovod.tensorflow``, or a RuntimeError that says how to install it."""
    try:
        import horovod.tensorflow as hvd
    except ImportError as err:
        raise RuntimeError(f"{INSTALL_HINT} ({err})") from None
    return hvd


class HorovodCollectives:
    """Horovod collectives on small host values and Keras 3 variables.

    Used by the ``horovod`` and ``ddl`` strategies and, with no tfscale config at all, by the
    public callbacks in a user's own ``model.fit`` script. Initialises Horovod if needed.
    """

    def __init__(self, process_set: Any = None) -> None:
        self.hvd = import_horovod()
        if not self.hvd.is_initialized():
            self.hvd.init()
        self.process_set = process_set if process_set is not None else self.hvd.global_process_set
        self._calls = 0

    @property
    def rank(self) -> int:
        return int(self.hvd.rank())

    @property
    def size(self) -> int:
        return int(self.hvd.size())

    def _name(self, kind: str) -> str:
        # Horovod matches tensors across ranks by name; every rank makes the same calls in the
        # same order, so a counter gives matching, never-colliding names.
        self._calls += 1
        return f"tfscale.{kind}.{self._calls}"

    def all_reduce(self, values: Sequence[float] | np.ndarray, op: str = "mean") -> np.ndarray:
        if op not in _OPS:
            raise ValueError(f"all_reduce op {op!r}; expected one of {_OPS}")
        import tensorflow as tf

        hvd_op = {"mean": self.hvd.Average, "sum": self.hvd.Sum,
                  "max": self.hvd.Max, "min": self.hvd.Min}[op]
        tensor = tf.constant(np.asarray(values, dtype=np.float64))
        out = self.hvd.allreduce(tensor, op=hvd_op, name=self._name("allreduce"),
                                 process_set=self.process_set)
        return np.asarray(out.numpy(), dtype=np.float64)

    def broadcast(self, values: Sequence[float] | np.ndarray, root: int = 0) -> np.ndarray:
        import tensorflow as tf

        tensor = tf.constant(np.asarray(values, dtype=np.float64))
        out = self.hvd.broadcast(tensor, root_rank=root, name=self._name("broadcast"),
                                 process_set=self.process_set)
        return np.asarray(out.numpy(), dtype=np.float64)

    def broadcast_variables(self, variables: Sequence[keras.Variable], root: int = 0) -> None:
        tf_variables = [v.value for v in variables]
        self.hvd.broadcast_variables(tf_variables, root_rank=root, process_set=self.process_set)


def with_gradient_reduction(
    optimizer: keras.optimizers.Optimizer, reduce: Callable[[list[Any]], list[Any]]
) -> keras.optimizers.Optimizer:
    """Makes ``optimizer`` pass its gradients through ``reduce`` before applying them.

    The optimizer object keeps its state; its class is swapped for a subclass whose ``apply``
    reduces first. Wrapping the outermost optimizer (a LossScaleOptimizer under float16) makes
    every worker see the same gradients before the finite check, so all skip or apply together.
    The subclass keeps the base class's name and module, so a saved model records (and
    reloads with) the plain optimizer.
    """
    base = type(optimizer)
    if getattr(base, "_tfscale_reducing", False):
        raise ValueError(f"optimizer {optimizer.name!r} already reduces its gradients")

    def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        present = [g for g in grads if g is not None]
        reduced = iter(self._tfscale_reduce(present)) if present else iter(())
        grads = [None if g is None else next(reduced) for g in grads]
        return base.apply(self, grads, trainable_variables)

    cls = type(base.__name__, (base,), {"apply": apply, "_tfscale_reducing": True,
                                        "__module__": base.__module__,
                                        "__qualname__": base.__qualname__})
    optimizer.__class__ = cls
    optimizer._tfscale_reduce = reduce
    return optimizer


def distributed_optimizer(
    optimizer: keras.optimizers.Optimizer, compression: bool = False, process_set: Any = None
) -> keras.optimizers.Optimizer:
    """Averages gradients across Horovod workers with one fused grouped all-reduce.

    Args:
        optimizer: a Keras 3 optimizer (or LossScaleOptimizer).
        compression: cast gradients to float16 for the exchange.
        process_set: Horovod process set (default: all workers).
    """
    hvd = import_horovod()
    kwargs: dict[str, Any] = {"op": hvd.Average,
                              "compression": hvd.Compression.fp16 if compression
                              else hvd.Compression.none}
    if process_set is not None:
        kwargs["process_set"] = process_set

    def reduce(grads: list[Any]) -> list[Any]:
        return list(hvd.grouped_allreduce(grads, **kwargs))

    return with_gradient_reduction(optimizer, reduce)


def horovod_knobs(config: Any) -> dict[str, str]:
    """Horovod environment settings for the config's communication flags."""
    env: dict[str, str] = {}
    if config.fusion_threshold_mb >= 0:
        env["HOROVOD_FUSION_THRESHOLD"] = str(int(config.fusion_threshold_mb * 1024 * 1024))
    if config.cycle_time_ms >= 0:
        env["HOROVOD_CYCLE_TIME"] = str(config.cycle_time_ms)
    if config.collective_timeout_s:
        # A rank that stops submitting tensors (stuck or dead) shuts the job down instead of
        # hanging it; Gloo's own socket timeout covers a peer that vanishes mid-transfer.
        timeout = max(2, int(config.collective_timeout_s))
        env["HOROVOD_STALL_CHECK_TIME_SECONDS"] = str(max(1, timeout // 2))
        env["HOROVOD_STALL_SHUTDOWN_TIME_SECONDS"] = str(timeout)
        env["HOROVOD_GLOO_TIMEOUT_SECONDS"] = str(timeout)
    return env


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
    """Horovod: one process per replica, fused all-reduce of gradients (Gloo or MPI)."""

    launcher = "horovod"
    # Horovod's XLA ops are left out of the build (see BUILD.md), so the all-reduce cannot be
    # inside an XLA-compiled training step: --xla=jit compiles the model's passes only.
    jit_scope = "model"

    @classmethod
    def check_environment(cls) -> None:
        try:
            import_horovod()
        except RuntimeError as err:
            raise ValueError(str(err)) from None

    def setup(self) -> None:
        os.environ.update(horovod_knobs(self.config))
        self.comm = HorovodCollectives()
        self._check_size()
        pin_gpu(self.local_rank)

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
        return distributed_optimizer(optimizer, compression=self.config.fp16_allreduce)

    def callbacks(self) -> list[keras.callbacks.Callback]:
        from tfscale.callbacks import BroadcastInitialState, MetricAverage

        return [BroadcastInitialState(self.comm), MetricAverage(self.comm)]

    def all_reduce(self, values: Sequence[float] | np.ndarray, op: str = "mean") -> np.ndarray:
        return self.comm.all_reduce(values, op)

    def broadcast(self, values: Sequence[float] | np.ndarray, root: int = 0) -> np.ndarray:
        return self.comm.broadcast(values, root)

    def broadcast_variables(self, variables: Sequence[keras.Variable], root: int = 0) -> None:
        self.comm.broadcast_variables(variables, root)
