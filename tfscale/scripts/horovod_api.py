"""Horovod's API for users' own scripts over ``tfscale.train``'s node exchange.

The functions of :mod:`tfscale.exchange.horovod_runtime` are Horovod's, made to work on Keras 3; the
ones here are what ``tfscale.horovod`` offers a user's script where they differ: gradients
(:func:`node_reduction`, which ``DistributedOptimizer`` takes) and eager host collectives of the
whole job go through the shared-memory exchange that the ``horovod`` strategy sets up
(:func:`tfscale.exchange.setup.horovod_reduction`), where every rank of a node sees the
same ``/dev/shm``; elsewhere, and inside a ``tf.function``, they are Horovod's.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from tfscale.exchange import horovod_runtime as runtime
from tfscale.exchange import setup as exchange
from tfscale.exchange.horovod_runtime import HorovodCollectives, import_horovod
from tfscale.exchange.optimizer import (
    horovod_allreduce,
    horovod_summed,
    process_set_size,
    with_gradient_reduction,
)

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from tfscale.exchange.hierarchical import HierarchicalAllReduce
    from tfscale.exchange.placement import ExchangePlan


def init(*args: Any, **kwargs: Any) -> None:
    """Starts Horovod (``horovod.tensorflow.init``'s arguments, e.g. ``process_sets``) with
    ``tfscale.train``'s defaults for the node exchange that users' scripts then share
    (:func:`node_reduction`).

    On CPUs, unless ``HOROVOD_CYCLE_TIME`` is set, Horovod's cycle is the one the ``horovod``
    strategy takes (:mod:`tfscale.exchange.setup`): long where every rank is on this
    node and exchanges through shared memory, so that Horovod's idle thread does not slow the
    steps. A job of several nodes of several ranks starts with dynamic process sets (unless
    ``process_sets`` is given), which the hierarchical exchange registers.
    """
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
    runtime.shutdown()


def _has_gpu() -> bool:
    import tensorflow as tf

    return bool(tf.config.list_physical_devices("GPU"))


# The node exchange of this Horovod session for users' scripts, once set up: {"reduce": ...}.
_node: dict[str, Any] = {}


def node_reduction() -> HierarchicalAllReduce | None:
    """This job's all-reduce through shared memory inside each node (hierarchically with
    Horovod across nodes), as the ``horovod`` strategy of ``tfscale.train`` sets it up
    (:func:`tfscale.exchange.setup.horovod_reduction`, with the mode of
    :data:`~tfscale.exchange.setup.MODE_VARIABLE`); None where Horovod carries the
    gradients. It copies its results; it averages when called and sums with ``.sum``.

    Set up on the first call of the session (a collective then: every rank must make it, as
    they do when they all wrap their optimizer or average their metrics), the same object
    afterwards, and again after :func:`shutdown`. Starts Horovod if needed.

    Raises:
        ValueError: for ``TFSCALE_NODE_EXCHANGE=shared_memory`` where it cannot run.
    """
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


def _host_exchange(process_set: Any) -> HierarchicalAllReduce | None:
    """The shared-memory exchange for an eager collective of the whole job when every rank is
    on this node (:func:`node_reduction`), else None (Horovod carries it). Host values then
    stay off Horovod, as under the ``horovod`` strategy."""
    import tensorflow as tf

    hvd = import_horovod()
    whole_job = process_set is None or process_set is hvd.global_process_set
    if not tf.executing_eagerly() or not whole_job:
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
    return runtime.allreduce(value, name=name, average=average,
                             prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                             op=op, compression=compression, process_set=process_set)


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
    return runtime.broadcast(tensor, root_rank, name=name, process_set=process_set)


class ScriptCollectives(HorovodCollectives):
    """:class:`HorovodCollectives` for a user's script: host values of the whole job go
    through the job's shared-memory exchange (:func:`node_reduction`) where every rank is on
    this node, as ``tfscale.train``'s do; Horovod's otherwise. Starts Horovod with
    :func:`init`'s defaults if needed."""

    def __init__(self, process_set: Any = None) -> None:
        if not import_horovod().is_initialized():
            init()
        super().__init__(process_set)

    def all_reduce(self, values: Sequence[float] | np.ndarray, op: str = "mean") -> np.ndarray:
        shared = _host_exchange(self.process_set)
        out = None if shared is None else shared.host_all_reduce(values, op)
        return super().all_reduce(values, op) if out is None else out

    def broadcast(self, values: Sequence[float] | np.ndarray, root: int = 0) -> np.ndarray:
        array = np.asarray(values, dtype=np.float64)
        rows = _gathered(array, self.process_set)
        return super().broadcast(values, root) if rows is None else np.asarray(rows[root])


def DistributedOptimizer(  # noqa: N802 - Horovod's name, so scripts keep their call
    optimizer: keras.optimizers.Optimizer, name: str | None = None, compression: Any = None,
    sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0, op: Any = None,
    backward_passes_per_step: int = 1, average_aggregated_gradients: bool = False,
    process_set: Any = None, gradient_lag: int = 0, node_exchange: bool = True,
) -> keras.optimizers.Optimizer:
    """Averages (or sums) gradients across Horovod workers with one fused grouped all-reduce
    per step, like ``horovod.tensorflow.keras.DistributedOptimizer``, or, where the ranks of a
    node all see the same ``/dev/shm``, through the node exchange of ``tfscale.train``
    (:func:`tfscale.scripts.horovod_api.node_reduction`).

    The optimizer is changed in place and returned; its state, ``get_config`` and saved form
    stay those of the plain optimizer, so ``model.save`` writes a model that plain Keras loads.

    Args:
        optimizer: a Keras 3 optimizer, or a ``keras.optimizers.LossScaleOptimizer``.
        name: accepted for compatibility (Horovod names its ops after it); unused.
        compression: ``Compression.none`` (default) or ``Compression.fp16`` (send float16).
        sparse_as_dense: turn ``IndexedSlices`` gradients (embeddings) into dense tensors,
            which the grouped all-reduce needs.
        gradient_predivide_factor: divide by this before the sum and by size/this after it
            (``op=Average`` only).
        op: ``Average`` (default) or ``Sum``.
        backward_passes_per_step: passes whose gradients are summed locally before one
            all-reduce and one update.
        average_aggregated_gradients: divide the locally summed gradients by
            ``backward_passes_per_step``.
        process_set: Horovod process set whose workers take part (default: all).
        gradient_lag: 1 applies each step's averaged gradients one step later, so that their
            all-reduce overlaps the next step's forward and backward pass (Kurth et al.,
            SC18; not in Horovod); 0 (default) applies them in their own step.
        node_exchange: take the job's node exchange where it has one (not in Horovod); a
            strategy that has chosen the transport itself passes False.

    Raises:
        ValueError: for an ``op`` other than Average/Sum, a predivide factor with ``Sum``,
            ``backward_passes_per_step`` < 1, or a ``gradient_lag`` that
            :func:`with_gradient_reduction` refuses.
    """
    hvd = import_horovod()
    reduce = horovod_allreduce(hvd, op, compression, sparse_as_dense, gradient_predivide_factor,
                               process_set)
    op = hvd.Average if op is None else op
    shared = _shared_reduction(hvd, compression, process_set) if node_exchange else None
    if shared is None:
        # Horovod carries them; a mean as Horovod's sum of a divided loss's gradients, as below.
        summed = horovod_summed(hvd, op, compression, sparse_as_dense, gradient_predivide_factor,
                                process_set)
        return with_gradient_reduction(optimizer, reduce, backward_passes_per_step,
                                       average_aggregated_gradients, gradient_lag,
                                       summed=summed,
                                       workers=process_set_size(hvd, process_set))
    if op != hvd.Average:
        return with_gradient_reduction(optimizer, shared.sum, backward_passes_per_step,
                                       average_aggregated_gradients, gradient_lag)
    # A mean: a step of Keras' own divides its loss by the workers and the exchange sums,
    # which spares the mean's pass over the gradients (a custom loop that does not call
    # ``optimizer.scale_loss`` keeps the exchange's mean).
    return with_gradient_reduction(optimizer, shared, backward_passes_per_step,
                                   average_aggregated_gradients, gradient_lag,
                                   summed=shared.sum, workers=shared.topology.size)


def _shared_reduction(hvd: Any, compression: Any, process_set: Any,
                      ) -> HierarchicalAllReduce | None:
    """The gradients' reduction through the job's node exchange (its mean; ``.sum`` sums), as
    ``tfscale.train``'s ``horovod`` strategy sets it up
    (:func:`tfscale.scripts.horovod_api.node_reduction`: shared memory inside each node where
    every rank of it sees the same ``/dev/shm``), or None where Horovod's ``grouped_allreduce``
    carries them: another process set than the whole job's, a compression other than none or
    fp16, or no node exchange. A collective when the process set is the whole job's (every rank
    wraps its optimizer)."""
    fp16 = compression is hvd.Compression.fp16
    whole_job = process_set is None or process_set is hvd.global_process_set
    if not whole_job or not (fp16 or compression in (None, hvd.Compression.none)):
        return None
    reduce = node_reduction()
    if reduce is None:
        return None
    # Transient: the optimizer applies the reduced gradients within the step. A predivide
    # factor only moves where Horovod divides; the mean is the same.
    return exchange.transient(reduce, fp16, "tfscale.horovod")


def load_model(filepath: str, custom_optimizers: list[type] | None = None,
               custom_objects: dict[str, Any] | None = None,
               compression: Any = None) -> keras.Model:
    """Loads a model saved with ``model.save`` and makes its optimizer distributed, like
    ``horovod.tensorflow.keras.load_model``.

    Args:
        filepath: a ``.keras`` file.
        custom_optimizers: optimizer classes the file may name beyond Keras's own.
        custom_objects: other custom classes and functions, as for ``keras.models.load_model``.
        compression: as for :func:`DistributedOptimizer`.
    """
    import keras

    objects = {**{cls.__name__: cls for cls in custom_optimizers or []},
               **(custom_objects or {})}
    model = keras.models.load_model(filepath, custom_objects=objects)
    if getattr(model, "optimizer", None) is not None:
        DistributedOptimizer(model.optimizer, compression=compression)
    return model
