"""Gradient exchange inside a Keras 3 optimizer, the base of Horovod's ``DistributedOptimizer``
for Keras 3 (:mod:`tfscale.scripts.horovod_api`) and of the strategies that reduce themselves.

Horovod 0.28's Keras optimizer overrides methods Keras 2 called (``get_gradients``,
``_aggregate_gradients``) that Keras 3 never calls, so under Keras 3 its gradients are not
averaged at all. Keras 3 calls one method per step, ``apply(grads, variables)``, inside the
traced training function; the wrapper here reduces the gradients there, before anything else
the optimizer does (loss-scale finite check, clipping, update), so every worker applies the
same step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tfscale.exchange import sharded_update, timing
from tfscale.exchange.interface import Entry

if TYPE_CHECKING:
    import keras

    from tfscale.exchange.hierarchical import HierarchicalAllReduce

Reduce = Callable[[list[Any]], list[Any]]


def with_gradient_reduction(
    optimizer: keras.optimizers.Optimizer, reduce: Reduce, backward_passes_per_step: int = 1,
    average_aggregated_gradients: bool = False, gradient_lag: int = 0,
    summed: Reduce | None = None, workers: int = 1,
    shard_update: HierarchicalAllReduce | None = None,
) -> keras.optimizers.Optimizer:
    """Makes ``optimizer`` pass its gradients through ``reduce`` before applying them.

    The optimizer object keeps its state; its class is swapped for a subclass whose ``apply``
    reduces first. Wrapping the outermost optimizer (a LossScaleOptimizer under float16) makes
    every worker see the same gradients before the finite check, so all skip or apply together.
    The subclass keeps the base class's name and module, so a saved model records (and
    reloads with) the plain optimizer.

    With ``backward_passes_per_step`` N > 1, gradients are summed locally over N passes and
    reduced and applied once, on the N-th (divided by N if ``average_aggregated_gradients``);
    the passes in between only count ``iterations``. The local sums live in ``tf.Variable``s
    outside the optimizer's Keras variables, so saved optimizer state matches the plain one.

    With ``gradient_lag=1`` (Kurth et al., SC18) step t reduces and applies the gradients of
    step t-1 and keeps its own for step t+1 (:func:`_lagged_apply`). The reduction then depends
    only on a variable written by the previous step, not on this step's backward pass, so
    the graph runs it alongside this step's forward and backward pass. The first step applies
    zero gradients (it only primes the lag); the last step's gradients are never applied.

    ``summed``, the sum over the ``workers`` that ``reduce`` averages over, spares the mean its
    pass over the gradients: where the training step divides its loss through
    ``optimizer.scale_loss`` (Keras' own ``train_step`` and tfscale's accumulating one do), the
    wrapper divides it by ``workers`` too, and that step's gradients, already divided, are
    summed. The result is the mean: bit for bit when ``workers`` is a power of two (a division
    by 2**k commutes with every rounding of the backward pass), within float32 rounding
    otherwise. A step that does not call ``scale_loss`` (a custom loop's ``apply_gradients``)
    gets ``reduce``'s mean, as does every step under a lag (its pending gradients are saved
    averaged, :func:`averaged_lag_gradients`).

    ``shard_update``, the one-node shared-memory all-reduce behind ``summed``, shards SGD's
    momentum update over the node's processes in the steps that sum
    (:mod:`tfscale.exchange.sharded_update`; the caller checks that the optimizer and the
    exchange allow it). Every save of the optimizer's state must then gather the momentum
    first (:func:`sharded_update.gather_momentum`).

    Raises:
        ValueError: if ``optimizer`` already reduces, ``backward_passes_per_step`` < 1,
            ``gradient_lag`` is not 0 or 1, or a lag is combined with
            ``backward_passes_per_step`` > 1 or with a LossScaleOptimizer.
    """
    base = type(optimizer)
    if getattr(base, "_tfscale_reducing", False):
        raise ValueError(f"optimizer {optimizer.name!r} already reduces its gradients")
    if backward_passes_per_step < 1:
        raise ValueError(f"backward_passes_per_step={backward_passes_per_step}; must be >= 1")
    if gradient_lag not in (0, 1):
        raise ValueError(f"gradient_lag={gradient_lag}; must be 0 or 1")
    if gradient_lag and backward_passes_per_step > 1:
        raise ValueError("gradient_lag does not combine with backward_passes_per_step > 1; "
                         "accumulate in the training step instead "
                         "(tfscale.training.optimizers.accumulate_gradients)")
    if gradient_lag and hasattr(optimizer, "inner_optimizer"):
        raise ValueError("gradient_lag does not combine with a LossScaleOptimizer: a lagged "
                         "gradient would be unscaled with the next step's loss scale")

    if workers < 1:
        raise ValueError(f"workers={workers}; must be >= 1")
    if not gradient_lag:  # a lagged exchange overlaps the next step: nothing is waited for
        reduce = timing.timed(reduce)
    reduce_present = _skipping_none(reduce)
    # A lag keeps the mean, and one worker has nothing to divide.
    sum_present = (None if summed is None or workers == 1 or gradient_lag
                   else _skipping_none(timing.timed(summed)))
    shard = (shard_update if sum_present is not None and backward_passes_per_step == 1
             else None)

    def scale_loss(self: Any, loss: Any) -> Any:
        loss = base.scale_loss(self, loss)
        if sum_present is None:
            return loss
        import tensorflow as tf

        # Read by this trace's apply: its gradients come from the divided loss.
        self._tfscale_divided_in = tf.compat.v1.get_default_graph()
        return loss * tf.cast(1.0 / workers, loss.dtype)

    def apply(self: Any, grads: Any, trainable_variables: Any = None) -> Any:
        import tensorflow as tf

        grads = list(grads)
        if trainable_variables is not None:
            trainable_variables = list(trainable_variables)
        if gradient_lag:
            return _lagged_apply(self, base, grads, trainable_variables, reduce_present)
        divided = self.__dict__.pop("_tfscale_divided_in", None)
        step_reduce = (sum_present if sum_present is not None
                       and divided is tf.compat.v1.get_default_graph() else reduce_present)
        if backward_passes_per_step == 1:
            if (shard is not None and step_reduce is sum_present
                    and not _overwritten(trainable_variables
                                         or getattr(self, "_trainable_variables", []))):
                # The sum is left to the update (_backend_update_step), which shards it.
                self._tfscale_shard_in = tf.compat.v1.get_default_graph()
                return base.apply(self, grads, trainable_variables)
            return base.apply(self, step_reduce(grads), trainable_variables)
        return _accumulate_then_apply(self, base, grads, trainable_variables, step_reduce,
                                      backward_passes_per_step, average_aggregated_gradients)

    def backend_update_step(self: Any, grads: Any, trainable_variables: Any,
                            learning_rate: Any) -> Any:
        import tensorflow as tf

        if self.__dict__.pop("_tfscale_shard_in", None) is tf.compat.v1.get_default_graph():
            assert shard is not None and sum_present is not None
            grads = list(grads)
            if sharded_update.apply(self, shard, grads, list(trainable_variables),
                                    learning_rate) is not None:
                return None
            grads = sum_present(grads)  # gradients the op cannot take: the unsharded update
        return base._backend_update_step(self, grads, trainable_variables, learning_rate)

    cls = type(base.__name__, (base,), {"apply": apply, "scale_loss": scale_loss,
                                        "_backend_update_step": backend_update_step,
                                        "_tfscale_reducing": True,
                                        "_tfscale_lag": gradient_lag,
                                        "_tfscale_reduce": staticmethod(reduce_present),
                                        "__module__": base.__module__,
                                        "__qualname__": base.__qualname__})
    optimizer.__class__ = cls
    return optimizer


def _overwritten(variables: list[Any]) -> bool:
    """Whether Keras overwrites one of ``variables`` with its gradient instead of updating it
    (float8 scales): it must get the sum before the update, not inside it."""
    return any(getattr(v, "overwrite_with_gradient", False) for v in variables)


def _skipping_none(reduce: Reduce) -> Reduce:
    """``reduce`` for a list of gradients with None where a variable has none."""

    def reduce_present(grads: list[Any]) -> list[Any]:
        present = [g for g in grads if g is not None]
        reduced = iter(reduce(present)) if present else iter(())
        return [None if g is None else next(reduced) for g in grads]

    return reduce_present


def _lagged_apply(optimizer: Any, base: Any, grads: list[Any], trainable_variables: Any,
                  reduce_present: Reduce) -> Any:
    """Reduces and applies the previous step's local gradients; keeps ``grads`` for the next.

    The previous gradients are read from variables at the start of the step (nothing else in
    the step writes them before), so their reduction has no input from this step's forward or
    backward pass and overlaps them. Horovod's ops are not stateful, so TensorFlow's automatic
    control dependencies do not serialise them behind the step's other ops either.
    """
    import tensorflow as tf

    variables = _variables(optimizer, trainable_variables)
    slots = _gradient_slots(optimizer, "_tfscale_lagged", grads, variables)
    previous = reduce_present([None if s is None else s.read_value() for s in slots])
    for slot, g in zip(slots, grads, strict=True):
        if slot is not None:
            slot.assign(tf.convert_to_tensor(g))  # dense: IndexedSlices cannot be kept
    return base.apply(optimizer, previous, variables)


# Checkpoint paths of the lag's pending gradients: this prefix and the variable's path.
LAG_PREFIX = "gradient_lag/"


def lag_slots(optimizer: keras.optimizers.Optimizer) -> list[Entry]:
    """The pending local gradients of ``optimizer``'s gradient lag, as checkpoint entries to
    restore into (zero until a step has run); [] without a lag. Call after
    ``optimizer.build``."""
    if not getattr(type(optimizer), "_tfscale_lag", 0):
        return []
    variables = list(optimizer._trainable_variables)
    slots = _gradient_slots(optimizer, "_tfscale_lagged", variables, variables)
    return [Entry(LAG_PREFIX + v.path, slot) for v, slot in zip(variables, slots, strict=True)]


def averaged_lag_gradients(optimizer: keras.optimizers.Optimizer) -> list[Entry]:
    """The pending gradients of ``optimizer``'s gradient lag averaged over the workers, which
    is what the next step applies, as checkpoint entries to save; [] without a lag.

    A collective when there is a lag (every worker calls it at the same step; it runs the
    optimizer's own reduction). Restored into every worker's pending gradients, the average
    makes the next step apply the same update as without the interruption: the mean of equal
    values is that value.
    """
    import numpy as np
    import tensorflow as tf

    slots = lag_slots(optimizer)
    if not slots:
        return []
    # Traced once per optimizer, not at every checkpoint.
    if not hasattr(optimizer, "_tfscale_lag_reduce"):
        optimizer._tfscale_lag_reduce = tf.function(type(optimizer)._tfscale_reduce,
                                                    autograph=False)
    reduce = optimizer._tfscale_lag_reduce
    # Copied at once: a shared-memory reduction's results are buffers it writes again later.
    averaged = [np.array(g) for g in reduce([e.value.read_value() for e in slots])]
    return [Entry(e.path, g) for e, g in zip(slots, averaged, strict=True)]


def _variables(optimizer: Any, trainable_variables: Any) -> list[Any]:
    """The variables an ``apply`` call updates (Keras's default: the optimizer's own)."""
    return (list(trainable_variables) if trainable_variables is not None
            else list(optimizer._trainable_variables))


def _gradient_slots(optimizer: Any, attribute: str, grads: list[Any],
                    variables: list[Any]) -> list[Any]:
    """One zero-initialised ``tf.Variable`` per variable, kept on the optimizer under
    ``attribute`` (None where the gradient is None).

    They are created on the first apply, usually while Keras traces the training step;
    ``init_scope`` makes them once, outside the traced function.
    """
    import tensorflow as tf

    if not hasattr(optimizer, attribute):
        with tf.init_scope():
            setattr(optimizer, attribute, {
                id(v): tf.Variable(tf.zeros(v.shape, v.dtype), trainable=False)
                for v in variables})
    slots = getattr(optimizer, attribute)
    return [None if g is None else slots[id(v)] for g, v in zip(grads, variables, strict=True)]


def _accumulate_then_apply(optimizer: Any, base: Any, grads: list[Any],
                           trainable_variables: Any, reduce_present: Reduce, passes: int,
                           average: bool) -> Any:
    import tensorflow as tf

    variables = _variables(optimizer, trainable_variables)
    sums = _gradient_slots(optimizer, "_tfscale_sums", grads, variables)
    if not hasattr(optimizer, "_tfscale_passes"):
        with tf.init_scope():
            optimizer._tfscale_passes = tf.Variable(0, dtype=tf.int64, trainable=False)
    for s, g in zip(sums, grads, strict=True):
        if s is not None:
            s.assign_add(tf.convert_to_tensor(g))
    optimizer._tfscale_passes.assign_add(1)

    def reduce_and_apply() -> None:
        total = [None if s is None else s.read_value() for s in sums]
        reduced = reduce_present(total)
        if average:
            reduced = [None if g is None else g / passes for g in reduced]
        base.apply(optimizer, reduced, variables)
        for s in sums:
            if s is not None:
                s.assign(tf.zeros_like(s))
        optimizer._tfscale_passes.assign(0)

    def count_pass() -> None:
        optimizer.iterations.assign_add(1)

    # Every worker runs the same number of passes, so all take the same branch and the
    # collectives inside reduce_and_apply match up.
    tf.cond(optimizer._tfscale_passes >= passes, reduce_and_apply, count_pass)


def horovod_allreduce(hvd: Any, op: Any = None, compression: Any = None,
                      sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                      process_set: Any = None) -> Reduce:
    """The reduction of Horovod's ``grouped_allreduce`` (tensor fusion), for
    :func:`with_gradient_reduction`: the gradients of a step averaged (``op=Average``) or summed
    over ``process_set``'s workers (default: all), sent as ``compression`` says; a one-rank
    set is the identity. Arguments as ``horovod.tensorflow.keras.DistributedOptimizer``'s.

    Raises:
        ValueError: for an ``op`` other than Average/Sum, or a predivide factor with ``Sum``.
    """
    import tensorflow as tf

    op = hvd.Average if op is None else op
    if op not in (hvd.Average, hvd.Sum):
        raise ValueError(f"op={op!r}: DistributedOptimizer supports Average and Sum")
    if gradient_predivide_factor != 1.0 and op != hvd.Average:
        raise ValueError("gradient_predivide_factor needs op=Average")
    kwargs: dict[str, Any] = {"compression": compression or hvd.Compression.none}
    if process_set is not None:
        kwargs["process_set"] = process_set
    if gradient_predivide_factor != 1.0:
        size = process_set_size(hvd, process_set)
        kwargs.update(op=hvd.Sum, prescale_factor=1.0 / gradient_predivide_factor,
                      postscale_factor=gradient_predivide_factor / size)
    else:
        kwargs["op"] = op

    def reduce(grads: list[Any]) -> list[Any]:
        if process_set_size(hvd, process_set) == 1:
            # Nothing to exchange: a one-rank all-reduce is the identity (also with Sum and the
            # pre/post-scaling, which cancel), but costs a round through Horovod's background
            # thread on every step.
            return grads
        if sparse_as_dense:
            grads = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g
                     for g in grads]
        return list(hvd.grouped_allreduce(grads, **kwargs))

    return reduce


def horovod_summed(hvd: Any, op: Any = None, compression: Any = None,
                   sparse_as_dense: bool = False, gradient_predivide_factor: float = 1.0,
                   process_set: Any = None) -> Reduce | None:
    """The sum that stands in for :func:`horovod_allreduce`'s mean (same arguments) as
    :func:`with_gradient_reduction`'s ``summed``: Horovod's ``Sum`` of the gradients of a loss
    divided by the workers. Horovod's ``Average`` scales the summed buffer in its background
    thread, between the exchange and the update; with two ranks on a core behind a 1 Gbit/s link
    that cost mlp's flat run 5% of its images/s (docs/FORECAST.md, "Horovod's Average"). None
    where the mean must stay Horovod's: an op other than ``Average``, a compression (float16
    would lose the small gradients that the division pushes below its range), a predivide
    factor."""
    plain = compression is None or compression is hvd.Compression.none
    if op not in (None, hvd.Average) or not plain or gradient_predivide_factor != 1.0:
        return None
    return horovod_allreduce(hvd, hvd.Sum, sparse_as_dense=sparse_as_dense,
                             process_set=process_set)


def process_set_size(hvd: Any, process_set: Any) -> int:
    """Workers in Horovod ``process_set`` (None: the whole job)."""
    return int(hvd.size() if process_set is None else process_set.size())
