"""``model.fit`` under ``tf.distribute.MultiWorkerMirroredStrategy`` with Keras 3: the fix
behind :mod:`tfscale.multiworker` (users' scripts) and the ``multiworker`` strategy.

Keras 3 (3.15.1 on TF 2.21) fails to train under MultiWorkerMirroredStrategy, and its
maintainers say the strategy is not supported in Keras 3. One call fixes it for the process::

    import tfscale.multiworker
    tfscale.multiworker.enable()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()     # TF_CONFIG as usual
    with strategy.scope():
        model = build_and_compile()
    model.fit(dataset, epochs=3, steps_per_epoch=70)

The workers then start from worker 0's variables (the strategy broadcasts them when they are
created), average gradients every step (Keras's optimizer under the strategy), so their weights
stay identical, and log the loss and metrics averaged over all workers.

Upstream causes, both in ``keras/src/backend/tensorflow/trainer.py`` (remove this module once
Keras fixes them):

1. ``TensorFlowTrainer._maybe_symbolic_build`` builds the model before the first step from
   one distributed batch averaged with ``strategy.reduce("MEAN", batch, axis=None)``, which
   fails for a multi-worker strategy ("Attempt to convert a value (PerReplica...)"). A
   symbolic build only needs shapes and dtypes, so it is built from the first local
   replica's batch instead.
2. ``reduce_per_replica`` reduces every train-step output of a multi-worker collective
   strategy with ``strategy.reduce("MEAN", v, axis=0)``, which fails on the scalar loss and
   metric logs ("Invalid reduction dimension 0"); Keras hard-codes ``reduction="auto"`` there.
   Scalars are averaged over the workers instead (what the logs should show), all of a step's
   in one collective (``strategy.reduce`` would run one per value: 4% of a 28 ms ``mlp`` step
   with two workers); everything else is reduced as Keras does. :func:`keep_logs_local` leaves
   a step's scalars as each worker's own instead, for a caller that averages the epoch's.

A third change is for datasets you mark as each worker's own, and makes them faster: Keras
hands ``model.fit``'s dataset to ``strategy.experimental_distribute_dataset``, which shards it
across the workers. A dataset that already holds this worker's shard, batched per replica, is
marked with :func:`per_worker_dataset`; it is then iterated as it is where each worker has one
replica on a CPU (a distributed dataset's iterator cost 0.37 ms of a 5.3 ms ``mlp`` step
there, 7%), and given to ``distribute_datasets_from_function`` elsewhere::

    model.fit(tfscale.multiworker.per_worker_dataset(my_shard.batch(64)), ...)

Where every worker runs on one host whose ``/dev/shm`` they all see, with one replica each
(CPU-only x86-64), ``fit`` sums the gradients and averages the logged scalars through the
shared-memory node exchange that ``tfscale.train --strategy=multiworker`` uses
(:func:`all_reduce_of`), not gRPC over loopback (``TFSCALE_NODE_EXCHANGE=collectives`` keeps
gRPC); and with one CPU replica per worker, a global dataset that TensorFlow shards is
iterated as this worker's shard of it, without the distributed iterator, where its batches
need no agreement to end.

All three replace private Keras functions, so :func:`enable` checks that the installed Keras is a
version the fix was made and tested for, and refuses others with an error that says what to do.
Unmarked datasets, and strategies other than multi-worker ones, go through Keras's own code
unchanged.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import keras
import numpy as np
import tensorflow as tf
from keras.src.backend.tensorflow import trainer as tf_trainer
from tensorflow.python.distribute import device_util

from tfscale.strategies.keras_version import check_keras_version

if TYPE_CHECKING:
    from tfscale.exchange.hierarchical import HierarchicalAllReduce
    from tfscale.exchange.placement import ExchangePlan

_originals: dict[str, Any] = {}
# Datasets marked by per_worker_dataset (held weakly: marking keeps nothing alive).
_per_worker: weakref.WeakSet[tf.data.Dataset] = weakref.WeakSet()


def _is_multi_worker(strategy: Any) -> bool:
    return bool(tf_trainer._collective_all_reduce_multi_worker(strategy))


def _first_local_replica(value: Any, strategy: tf.distribute.Strategy) -> Any:
    if isinstance(value, tf.distribute.DistributedValues):
        return strategy.experimental_local_results(value)[0]
    return value


def _maybe_symbolic_build(self: keras.Model, iterator: Any = None, data_batch: Any = None) -> None:
    if self._distribute_strategy is None or not _is_multi_worker(self.distribute_strategy):
        return _originals["_maybe_symbolic_build"](self, iterator=iterator, data_batch=data_batch)
    strategy = self.distribute_strategy
    if iterator is not None:
        for _, _, it in iterator:
            batch = next(it)
            data_batch = keras.tree.map_structure(
                lambda v: _first_local_replica(v, strategy), batch)
            break
    with strategy.scope():
        self._symbolic_build(data_batch=data_batch)
    _exchange_through_node(self, strategy)


def per_worker_dataset(dataset: tf.data.Dataset) -> tf.data.Dataset:
    """Marks ``dataset`` as this worker's own batches (its shard, batched per replica) and
    returns it, for ``model.fit`` under any strategy with the fix enabled: it is iterated as
    it is where the process has one replica, on a CPU; elsewhere it is given to
    ``distribute_datasets_from_function(lambda _: dataset)`` (a GPU replica gets its batches
    prefetched to it). Keras would otherwise hand it to ``experimental_distribute_dataset``,
    which shards it again and splits its batches as global ones."""
    _per_worker.add(dataset)
    return dataset


def _one_cpu_replica(strategy: Any) -> bool:
    """Whether this process runs one replica of ``strategy``, on a CPU. TensorFlow's default
    strategy lists no devices; its one replica takes a dataset as it is wherever it runs."""
    try:
        devices = strategy.extended.worker_devices
    except RuntimeError:  # the default strategy's
        return True
    return len(devices) == 1 and "CPU" in devices[0].upper()


def _epoch_iterator_init(self: Any, distribute_strategy: Any = None, *args: Any,
                         **kwargs: Any) -> None:
    # Keras's own TFEpochIterator.__init__, with the datasets marked by per_worker_dataset
    # taken as this worker's.
    tf_trainer.EpochIterator.__init__(self, *args, **kwargs)
    strategy = self._distribute_strategy = distribute_strategy
    dataset = self.data_adapter.get_tf_dataset()
    if dataset in _per_worker:
        if not _one_cpu_replica(strategy):
            dataset = strategy.distribute_datasets_from_function(lambda _: dataset)
    elif not isinstance(dataset, tf.distribute.DistributedDataset):
        dataset = _own_shard(strategy.experimental_distribute_dataset(dataset), strategy)
    self._distributed_dataset = dataset


def _own_shard(distributed: Any, strategy: Any) -> Any:
    """This worker's dataset inside ``distributed`` (TensorFlow's own sharding and rebatching
    of the global batches), iterated as it is where the worker has one replica, on a CPU, as
    :func:`per_worker_dataset`'s are: the distributed iterator cost 7% of an ``mlp`` step.
    ``distributed`` as it is where its iterator has more to do: several replicas, or batches
    that the workers must agree to end together (a finite dataset)."""
    if not _is_multi_worker(strategy) or not _one_cpu_replica(strategy):
        return distributed
    cloned = getattr(distributed, "_cloned_datasets", None)
    if (not isinstance(cloned, list) or len(cloned) != 1
            or getattr(distributed, "_enable_get_next_as_optional", True)):
        return distributed
    return cloned[0]


def _reduce_per_replica(values: Any, strategy: Any, reduction: str) -> Any:
    if reduction in ("auto", "mean") and _is_multi_worker(strategy):
        flat = keras.tree.flatten(values)
        scalars = [i for i, v in enumerate(flat) if v.shape.rank == 0]
        out = [v if i in scalars else strategy.reduce("MEAN", v, axis=0)
               for i, v in enumerate(flat)]
        mean = _log_means.get(id(strategy))
        if scalars and mean is not None:
            local = [strategy.experimental_local_results(flat[i])[0] for i in scalars]
            if mean is _keep_local:
                means = local
            else:
                means = mean([tf.cast(v, tf.float32) for v in local])
            for i, v, m in zip(scalars, local, means, strict=True):
                out[i] = tf.cast(m, v.dtype)
        elif scalars:
            # One collective for all the logged scalars (strategy.reduce would run one per
            # value, each a round trip between the workers, every step).
            device = (device_util.current() or strategy.extended._default_device
                      or "/device:CPU:0")
            means = strategy.extended.batch_reduce_to(
                tf.distribute.ReduceOp.MEAN, [(flat[i], device) for i in scalars])
            for i, mean in zip(scalars, means, strict=True):
                out[i] = strategy.experimental_local_results(mean)[0]
        return keras.tree.pack_sequence_as(values, out)
    return _originals["reduce_per_replica"](values, strategy, reduction)


# Strategies (by id) whose logged scalars are averaged by another all-reduce than theirs, or
# left as each worker's own (_keep_local).
_log_means: dict[int, Callable[[list[tf.Tensor]], list[tf.Tensor]]] = {}


def _keep_local(values: list[tf.Tensor]) -> list[tf.Tensor]:
    return values


def average_logs_with(strategy: tf.distribute.Strategy,
                      mean: Callable[[list[tf.Tensor]], list[tf.Tensor]] | None) -> None:
    """Makes the fix average ``strategy``'s logged scalars with ``mean`` (this process's
    float32 values in, their means over all workers out) instead of the strategy's collective,
    or, with None, with the strategy's collective again. Only for one replica per process.
    A gRPC round trip per step was 1.4 ms of an ``mlp`` step of 12 with two workers."""
    if mean is None:
        _log_means.pop(id(strategy), None)
    else:
        _log_means[id(strategy)] = mean


def keep_logs_local(strategy: tf.distribute.Strategy) -> None:
    """Makes the fix leave ``strategy``'s logged scalars of each step as this worker's own
    (as Horovod's workers log theirs), for a caller that averages the epoch's logs itself (the
    ``multiworker`` strategy: :class:`tfscale.callbacks.MetricAverage` over its collectives):
    no collective per step (3% of an ``mlp`` step with two workers on one node). Only for one
    replica per process; :func:`average_logs_with` (None) undoes it."""
    _log_means[id(strategy)] = _keep_local


def sum_gradients_with(optimizer: keras.optimizers.Optimizer,
                       reduce: Callable[[list[tf.Tensor]], list[tf.Tensor]] | None,
                       shard_update: HierarchicalAllReduce | None = None,
                       ) -> keras.optimizers.Optimizer:
    """Makes ``optimizer`` sum its gradients over the replicas with ``reduce`` (tensors in,
    their sums over all replicas out) instead of the strategy's all-reduce; with None, with
    the strategy's all-reduce as before, only timed (:mod:`tfscale.exchange.timing`, when
    enabled: the exchange's share of the step).

    Keras 3's TensorFlow optimizer sums the gradients in ``_all_reduce_sum_gradients`` (the
    loss is already divided by the number of replicas); that method is replaced on this
    optimizer object, or on the optimizer inside a ``LossScaleOptimizer``, whose own ``apply``
    calls the inner one's. Only for one replica per process: ``reduce`` sees this process's
    gradients. The ``multiworker`` strategy passes its shared-memory all-reduce. The class keeps
    its name and module, so a saved model reloads with the plain optimizer.

    ``shard_update``, the one-node shared-memory all-reduce behind ``reduce``, sums the
    gradients inside SGD's momentum update instead, sharded over the workers
    (:mod:`tfscale.exchange.sharded_update`; the caller checks that the optimizer and the
    exchange allow it, and gathers the momentum before saving it).
    """
    from tfscale.exchange import sharded_update, timing

    target = getattr(optimizer, "inner_optimizer", optimizer)
    base = type(target)

    def _all_reduce_sum_gradients(self: Any, grads_and_vars: Any) -> list[Any]:
        pairs = list(grads_and_vars)
        present = [i for i, (g, _) in enumerate(pairs) if g is not None]
        if not present or tf.distribute.get_replica_context() is None:
            return pairs
        started = timing.start([pairs[i][0] for i in present])
        if reduce is None:
            pairs = list(base._all_reduce_sum_gradients(self, pairs))
        else:
            sums = reduce([tf.convert_to_tensor(pairs[i][0]) for i in present])
            for i, total in zip(present, sums, strict=True):
                pairs[i] = (total, pairs[i][1])
        timing.stop(started, [pairs[i][0] for i in present])
        return pairs

    def _backend_update_step(self: Any, grads: Any, trainable_variables: Any,
                             learning_rate: Any) -> Any:
        if (shard_update is not None and tf.distribute.get_replica_context() is not None
                and sharded_update.apply(self, shard_update, list(grads),
                                         list(trainable_variables), learning_rate) is not None):
            return None
        return base._backend_update_step(self, grads, trainable_variables, learning_rate)

    target.__class__ = type(base.__name__, (base,), {
        "_all_reduce_sum_gradients": _all_reduce_sum_gradients, "_tfscale_summing": True,
        "_backend_update_step": _backend_update_step,
        "__module__": base.__module__, "__qualname__": base.__qualname__})
    return optimizer


def _sums_itself(optimizer: keras.optimizers.Optimizer) -> bool:
    """Whether :func:`sum_gradients_with` has already given ``optimizer`` its all-reduce."""
    return bool(getattr(getattr(optimizer, "inner_optimizer", optimizer), "_tfscale_summing",
                        False))


def set_all_reduce(strategy: tf.distribute.Strategy, reduce: HierarchicalAllReduce | None,
                      plan: ExchangePlan | None = None) -> None:
    """Records the node exchange of ``strategy``'s workers, set up by the caller (the
    ``multiworker`` strategy, from its ``--node_exchange``), so that :func:`all_reduce_of`
    does not set up another."""
    strategy._tfscale_all_reduce = (reduce, plan)


def all_reduce_of(strategy: tf.distribute.Strategy) -> HierarchicalAllReduce | None:
    """The shared-memory all-reduce of ``strategy``'s workers, as the ``multiworker`` strategy
    of ``tfscale.train`` sets it up (:func:`tfscale.exchange.setup.worker_reduction`,
    mode from :data:`~tfscale.exchange.setup.MODE_VARIABLE`): every worker on one host,
    where they all see the same ``/dev/shm``, and one replica each; None otherwise (the
    strategy's own collectives carry the gradients).

    Set up on the first call for a strategy: a collective then (every worker makes it; the
    fix makes it when ``fit`` or ``evaluate`` starts). It copies its results.

    Raises:
        ValueError: for ``TFSCALE_NODE_EXCHANGE=shared_memory`` where it cannot run.
    """
    from tfscale.exchange import setup as exchange
    from tfscale.exchange.placement import workers_limits

    if not hasattr(strategy, "_tfscale_all_reduce"):
        resolver = strategy.cluster_resolver
        spec = resolver.cluster_spec().as_dict() if resolver is not None else {}
        workers = [str(w) for w in spec.get("worker", [])]
        others = sorted(set(spec) - {"worker"})
        replicas = int(strategy.num_replicas_in_sync) // max(1, len(workers))
        why_not = workers_limits(replicas, other_tasks=others)
        if len(workers) < 2:
            set_all_reduce(strategy, None)
        else:
            set_all_reduce(strategy, *exchange.worker_reduction(
                int(resolver.task_id), workers, exchange.mode_from_environment(), "gRPC",
                lambda values: _sum_over_workers(strategy, values), why_not))
    reduce: HierarchicalAllReduce | None = strategy._tfscale_all_reduce[0]
    return reduce


def _sum_over_workers(strategy: tf.distribute.Strategy, values: np.ndarray) -> np.ndarray:
    """The element-wise sum of a float64 vector over the workers (one replica each), through
    the strategy's own collective."""
    if not hasattr(strategy, "_tfscale_gather"):
        # A gather, summed here: the strategy's all_reduce found no destinations outside a
        # training step ("destinations can not be empty").
        def gather(x: tf.Tensor) -> tf.Tensor:
            context = tf.distribute.get_replica_context()
            return context.all_gather(x[tf.newaxis], axis=0)

        strategy._tfscale_gather = tf.function(
            lambda t: strategy.run(gather, args=(t,)), autograph=False)
    out = strategy._tfscale_gather(tf.constant(values, tf.float64))
    rows = np.asarray(strategy.experimental_local_results(out)[0].numpy())
    return np.asarray(rows.sum(axis=0))


def _exchange_through_node(model: keras.Model, strategy: tf.distribute.Strategy) -> None:
    """Makes ``model``'s optimizer sum its gradients, and the steps average their logged
    scalars, through the workers' shared-memory exchange where :func:`all_reduce_of` has one,
    as ``tfscale.train --strategy=multiworker`` does (once per model; before its step is
    traced). An optimizer that already has its exchange is left as it is."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None or _sums_itself(optimizer):
        return
    reduce = all_reduce_of(strategy)
    if reduce is None:
        return
    from tfscale.exchange.setup import transient

    # Transient: the optimizer applies the summed gradients within the step.
    sum_gradients_with(optimizer, transient(reduce).sum)
    if id(strategy) not in _log_means:
        # A copying mean: the logs outlive the step.
        average_logs_with(strategy, reduce)


def is_enabled() -> bool:
    return bool(_originals)


def enable() -> None:
    """Makes Keras 3's ``model.fit``/``evaluate`` work under MultiWorkerMirroredStrategy in
    this process (idempotent). Call it before ``fit``; the strategy may exist already.

    Raises:
        RuntimeError: when the installed Keras is not one the fix was made for.
    """
    if is_enabled():
        return
    check_keras_version()
    _originals["_maybe_symbolic_build"] = tf_trainer.TensorFlowTrainer._maybe_symbolic_build
    _originals["reduce_per_replica"] = tf_trainer.reduce_per_replica
    _originals["epoch_iterator_init"] = tf_trainer.TFEpochIterator.__init__
    tf_trainer.TensorFlowTrainer._maybe_symbolic_build = _maybe_symbolic_build
    tf_trainer.reduce_per_replica = _reduce_per_replica
    tf_trainer.TFEpochIterator.__init__ = _epoch_iterator_init


def disable() -> None:
    """Restores Keras's own functions."""
    if not is_enabled():
        return
    tf_trainer.TensorFlowTrainer._maybe_symbolic_build = _originals.pop("_maybe_symbolic_build")
    tf_trainer.reduce_per_replica = _originals.pop("reduce_per_replica")
    tf_trainer.TFEpochIterator.__init__ = _originals.pop("epoch_iterator_init")


@contextlib.contextmanager
def enabled() -> Iterator[None]:
    """The fix while the context is open; afterwards it is as it was before (on or off)."""
    was_enabled = is_enabled()
    enable()
    try:
        yield
    finally:
        if not was_enabled:
            disable()
