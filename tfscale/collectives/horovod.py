"""Horovod's process group and its collectives on values and Keras 3 variables.

The functions follow ``horovod.tensorflow.keras`` (same names, arguments and results); they
call Horovod's TensorFlow ops, which work under Keras 3, and differ from them only where
Keras 3 objects need it: Keras variables are broadcast through their ``.value`` (a
``tf.Variable``). :class:`HorovodCollectives` offers the same operations on small float64
vectors with string ops, for tfscale's strategies and callbacks.

Horovod, TensorFlow and Keras are imported on first use, so importing this module loads none
of them.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, cast

import numpy as np

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from tfscale.collectives.hierarchical import HierarchicalAllReduce
    from tfscale.collectives.placement import ExchangePlan

INSTALL_HINT = (
    "Horovod is not importable in this environment. Build Horovod 0.28.1 with TensorFlow and "
    "Gloo from a tfscale checkout: `bash launch/setup.sh` for the checkout's .venv, or "
    "`launch/build_horovod.sh /path/to/python` for another environment that has TensorFlow "
    "(see BUILD.md); or pick --strategy default|mirrored|multiworker."
)
_OPS = ("mean", "sum", "max", "min")


def check_installed() -> None:
    """Raises RuntimeError (:data:`INSTALL_HINT`) unless Horovod is installed with its
    TensorFlow ops, without importing them or TensorFlow: a launcher checks this before it
    starts workers, which import both (:func:`import_horovod`)."""
    try:
        spec = importlib.util.find_spec("horovod.tensorflow")  # imports only horovod/__init__
    except ImportError as err:  # not installed, or its __init__ fails
        raise RuntimeError(f"{INSTALL_HINT} ({err})") from None
    folders = (spec.submodule_search_locations or []) if spec else []
    ops = [os.path.join(folder, f"mpi_lib{suffix}") for folder in folders
           for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    if not any(os.path.exists(path) for path in ops):
        raise RuntimeError(f"{INSTALL_HINT} (Horovod is installed without its TensorFlow ops: "
                           "no horovod/tensorflow/mpi_lib)")


def import_horovod() -> ModuleType:
    """``horovod.tensorflow``, or a RuntimeError that says how to install it."""
    try:
        import horovod.tensorflow as hvd
    except ImportError as err:
        raise RuntimeError(f"{INSTALL_HINT} ({err})") from None
    return hvd


def init(*args: Any, **kwargs: Any) -> None:
    """Starts Horovod (``horovod.tensorflow.init``'s arguments, e.g. ``process_sets``) with
    ``tfscale.train``'s defaults for the node exchange that users' scripts then share
    (:func:`node_reduction`).

    On CPUs, unless ``HOROVOD_CYCLE_TIME`` is set, Horovod's cycle is the one the ``horovod``
    strategy takes (:mod:`tfscale.collectives.exchange`): long where every rank is on this
    node and exchanges through shared memory, so that Horovod's idle thread does not slow the
    steps. A job of several nodes of several ranks starts with dynamic process sets (unless
    ``process_sets`` is given), which the hierarchical exchange registers.
    """
    from tfscale.collectives import exchange

    hvd = import_horovod()
    if not hvd.is_initialized():
        mode = exchange.mode_from_environment()
        if "HOROVOD_CYCLE_TIME" not in os.environ and not _has_gpu():
            long = exchange.one_node_shared_memory(mode)
            cycle = exchange.SHARED_MEMORY_CYCLE_TIME_MS if long else exchange.CPU_CYCLE_TIME_MS
            os.environ["HOROVOD_CYCLE_TIME"] = f"{cycle:g}"
        if (mode != "collectives" and "process_sets" not in kwargs and len(args) < 2
                and exchange.several_nodes()):
            kwargs["process_sets"] = "dynamic"
    hvd.init(*args, **kwargs)


def shutdown() -> None:
    """Stops Horovod's background thread; collectives fail after it."""
    _node.clear()
    import_horovod().shutdown()


def _has_gpu() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


# The node exchange of this Horovod session for users' scripts, once set up: {"reduce": ...}.
_node: dict[str, Any] = {}


def node_reduction() -> HierarchicalAllReduce | None:
    """This job's all-reduce through shared memory inside each node (hierarchically with
    Horovod across nodes), as the ``horovod`` strategy of ``tfscale.train`` sets it up
    (:func:`tfscale.collectives.exchange.horovod_reduction`, with the mode of
    :data:`~tfscale.collectives.exchange.MODE_VARIABLE`); None where Horovod carries the
    gradients. It copies its results; it averages when called and sums with ``.sum``.

    Set up on the first call of the session (a collective then: every rank must make it, as
    they do when they all wrap their optimizer or average their metrics), the same object
    afterwards, and again after :func:`shutdown`. Starts Horovod if needed.

    Raises:
        ValueError: for ``TFSCALE_NODE_EXCHANGE=shared_memory`` where it cannot run.
    """
    from tfscale.collectives import exchange

    if "reduce" not in _node:
        hvd = import_horovod()
        if not hvd.is_initialized():
            init()
        reduce, plan = exchange.horovod_reduction(hvd, int(hvd.rank()), int(hvd.size()),
                                                  exchange.mode_from_environment())
        _node.update(reduce=reduce, plan=plan)
    reduce = _node["reduce"]
    return reduce if reduce is None else cast("HierarchicalAllReduce", reduce)


def exchange_plan() -> ExchangePlan:
    """What carries this job's gradients under :func:`node_reduction` (sets it up)."""
    node_reduction()
    return cast("ExchangePlan", _node["plan"])


def is_initialized() -> bool:
    return bool(import_horovod().is_initialized())


def rank() -> int:
    """This process's global rank (0 is the chief)."""
    return int(import_horovod().rank())


def size() -> int:
    """Number of Horovod processes."""
    return int(import_horovod().size())


def local_rank() -> int:
    """This process's index on its node (pick the GPU with it)."""
    return int(import_horovod().local_rank())


def local_size() -> int:
    """Number of Horovod processes on this node."""
    return int(import_horovod().local_size())


def cross_rank() -> int:
    """Index of this process's node."""
    return int(import_horovod().cross_rank())


def cross_size() -> int:
    """Number of nodes."""
    return int(import_horovod().cross_size())


def _process_set(process_set: Any) -> Any:
    return import_horovod().global_process_set if process_set is None else process_set


def _host_exchange(process_set: Any) -> HierarchicalAllReduce | None:
    """The shared-memory exchange for an eager collective of the whole job when every rank is
    on this node (:func:`node_reduction`), else None (Horovod carries it). Host values then
    stay off Horovod, as under the ``horovod`` strategy."""
    import tensorflow as tf

    hvd = import_horovod()
    if not tf.executing_eagerly() or _process_set(process_set) is not hvd.global_process_set:
        return None
    reduce = node_reduction()
    return reduce if reduce is not None and reduce.one_node_shared_memory else None


def _gathered(value: Any, process_set: Any) -> np.ndarray | None:
    """Every rank's numeric ``value`` as the rows of one array (shape ``[size, *shape]``),
    through shared memory where :func:`_host_exchange` has it; None otherwise."""
    array = np.asarray(value)
    if array.dtype.kind not in "iuf":
        return None
    reduce = _host_exchange(process_set)
    if reduce is None or reduce.node is None:
        return None
    rows = reduce.node.gather(np.ascontiguousarray(array).reshape(-1))
    return np.asarray(rows).reshape((-1, *array.shape))


def allreduce(value: Any, name: str | None = None, average: bool | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0, op: Any = None,
              compression: Any = None, process_set: Any = None) -> tf.Tensor:
    """Reduces ``value`` (an array, number or tensor) over all processes; ``op`` defaults to
    ``Average``, as in Horovod. Returns a tensor of ``value``'s dtype.

    Called eagerly over the whole job on one node, it goes through the shared-memory exchange
    instead of Horovod (ops Average, Sum, Min and Max on numbers, without compression); every
    rank gets the same bits, as from Horovod. Inside a ``tf.function`` it is Horovod's op
    (with its gradient).
    """
    import tensorflow as tf

    hvd = import_horovod()
    resolved = hvd.Average if op is None else op
    plain = compression is None or compression is hvd.Compression.none
    if average is None and plain and resolved in (hvd.Average, hvd.Sum, hvd.Min, hvd.Max):
        tensor = tf.convert_to_tensor(value)
        floating = tensor.dtype.is_floating
        if floating or resolved != hvd.Average:
            scaled = tensor.numpy() * prescale_factor if floating else tensor.numpy()
            rows = _gathered(scaled, process_set)
            if rows is not None:
                reducers: dict[Any, Callable[..., Any]] = {
                    hvd.Average: np.mean, hvd.Sum: np.sum, hvd.Min: np.min, hvd.Max: np.max}
                out = reducers[resolved](rows, axis=0)
                if floating:
                    out = out * postscale_factor
                return tf.convert_to_tensor(np.asarray(out).astype(tensor.dtype.as_numpy_dtype))
    return hvd.allreduce(tf.convert_to_tensor(value), average=average, op=op, name=name,
                         prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                         compression=compression or hvd.Compression.none,
                         process_set=_process_set(process_set))


def allgather(value: Any, name: str | None = None, process_set: Any = None) -> tf.Tensor:
    """Concatenates every process's ``value`` along the first dimension, in rank order."""
    import tensorflow as tf

    return import_horovod().allgather(tf.convert_to_tensor(value), name=name,
                                      process_set=_process_set(process_set))


def broadcast(value: Any, root_rank: int, name: str | None = None,
              process_set: Any = None) -> tf.Tensor:
    """``root_rank``'s ``value`` on every process (eagerly over the whole job on one node,
    through the shared-memory exchange, as :func:`allreduce`)."""
    import tensorflow as tf

    tensor = tf.convert_to_tensor(value)
    if tensor.dtype.is_floating or tensor.dtype.is_integer:
        rows = _gathered(tensor.numpy(), process_set)
        if rows is not None:
            return tf.convert_to_tensor(rows[root_rank])
    return import_horovod().broadcast(tensor, root_rank, name=name,
                                      process_set=_process_set(process_set))


def broadcast_variables(variables: Sequence[Any], root_rank: int, process_set: Any = None,
                        inplace: bool = False) -> None:
    """Overwrites ``variables`` (Keras 3 variables or ``tf.Variable``s) with ``root_rank``'s
    values. Horovod's own function accepts only ``tf.Variable``s; a Keras 3 variable holds
    one in ``.value``."""
    import keras

    tf_variables = [v.value if isinstance(v, keras.Variable) else v for v in variables]
    import_horovod().broadcast_variables(tf_variables, root_rank,
                                         process_set=_process_set(process_set), inplace=inplace)


class HorovodCollectives:
    """Horovod collectives on small host values and Keras 3 variables.

    Used by the ``horovod`` and ``ddl`` strategies and, with no tfscale config at all, by the
    callbacks in a user's own ``model.fit`` script. Initialises Horovod if needed.

    Args:
        process_set: the Horovod process set whose ranks take part (default: all).
        node_exchange: host values of the whole job go through the job's shared-memory
            exchange (:func:`node_reduction`) where every rank is on this node, as
            ``tfscale.train``'s do. A strategy that sets up its own exchange passes False.
    """

    def __init__(self, process_set: Any = None, node_exchange: bool = True) -> None:
        self.hvd = import_horovod()
        if not self.hvd.is_initialized():
            if node_exchange:
                init()  # a user's script: tfscale's defaults
            else:  # a strategy has applied its own Horovod settings
                self.hvd.init()
        self.process_set = _process_set(process_set)
        self.node_exchange = node_exchange
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

    def _shared(self) -> HierarchicalAllReduce | None:
        return _host_exchange(self.process_set) if self.node_exchange else None

    def all_reduce(self, values: Sequence[float] | np.ndarray, op: str = "mean") -> np.ndarray:
        if op not in _OPS:
            raise ValueError(f"all_reduce op {op!r}; expected one of {_OPS}")
        shared = self._shared()
        if shared is not None:
            out = shared.host_all_reduce(values, op)
            if out is not None:
                return out
        import tensorflow as tf

        hvd_op = {"mean": self.hvd.Average, "sum": self.hvd.Sum,
                  "max": self.hvd.Max, "min": self.hvd.Min}[op]
        out = self.hvd.allreduce(tf.constant(np.asarray(values, dtype=np.float64)), op=hvd_op,
                                 name=self._name("allreduce"), process_set=self.process_set)
        return np.asarray(out.numpy(), dtype=np.float64)

    def broadcast(self, values: Sequence[float] | np.ndarray, root: int = 0) -> np.ndarray:
        array = np.asarray(values, dtype=np.float64)
        shared = self._shared()
        if shared is not None and shared.node is not None:
            return np.asarray(shared.node.gather(array.reshape(-1))[root]).reshape(array.shape)
        import tensorflow as tf

        out = self.hvd.broadcast(tf.constant(array), root, name=self._name("broadcast"),
                                 process_set=self.process_set)
        return np.asarray(out.numpy(), dtype=np.float64)

    def broadcast_variables(self, variables: Sequence[keras.Variable], root: int = 0) -> None:
        broadcast_variables(variables, root, process_set=self.process_set)
