"""Batch-norm statistics of the current weights for your own ``model.fit``.

:mod:`tfscale.training.bn_statistics` explains why: Keras' moving averages are stale after a few
hundred
steps, and under data parallelism each worker's come from its own shard. Drop the callback in
before any callback that saves the model at an epoch end::

    stats = tfscale.callbacks.BatchNormStatistics(train_batches)   # this worker's batches
    model.fit(train_batches, validation_data=val, epochs=8,
              callbacks=[stats, keras.callbacks.ModelCheckpoint(...)])

and, before each validation of ``fit`` (or a ``model.evaluate(..., callbacks=[stats])``), at
each epoch end and at the end of training, every batch-norm layer's mean and variance are
recomputed over ``images`` training images, shared out over the workers. ``tfscale.prepare``
adds it to its callbacks (``bn_statistics_data=``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import keras
import numpy as np

from tfscale.callbacks.step import optimizer_step
from tfscale.cluster import rank_zero
from tfscale.exchange.interface import Collectives
from tfscale.training import bn_statistics

Data = Iterable[Any] | Callable[[], Iterable[Any]]


class BatchNormStatistics(keras.callbacks.Callback):
    """Recomputes (or, without data, pools over the workers) the model's batch-norm statistics
    before each evaluation, at each epoch end and at the end of training, once per step.

    Args:
        data: this worker's training batches as ``fit`` reads them (images, or tuples whose
            first item is the images): a ``tf.data.Dataset``, another iterable that can be
            iterated again, or a function returning a new iterator. Every recomputation reads
            the first batches again. None: ``ema`` (the moving averages, pooled over workers).
        images: images per recomputation, all workers together (Wu & Johnson: 10^3-10^4).
        comm: collectives over the workers (``tfscale.prepare`` passes its strategy; so can
            a script that calls ``tfscale.setup()``). Default: the ``tf.distribute`` strategy
            the model was built under, when it has several replicas; else Horovod's, when
            Horovod is running; else none (one process).
        per_replica_batch: examples each replica normalizes together in training; 0: a batch
            of ``data`` divided by this process's replicas and by ``micro_batches``.
        micro_batches: with gradient accumulation, the micro-batches a batch of ``data`` is
            split into (``tfscale.prepare``'s ``grad_accum_steps``).
        mode: ``precise`` (needs ``data``), ``ema``, or ``auto`` (precise when given data).
    """

    def __init__(self, data: Data | None = None, images: int = bn_statistics.DEFAULT_IMAGES,
                 comm: Collectives | None = None, per_replica_batch: int = 0,
                 micro_batches: int = 1, mode: str = "auto") -> None:
        super().__init__()
        if mode not in bn_statistics.MODES:
            raise ValueError(f"BatchNormStatistics: mode={mode!r}; expected one of "
                             f"{', '.join(bn_statistics.MODES)}")
        if mode == "precise" and data is None:
            raise ValueError("BatchNormStatistics: mode='precise' recomputes from training "
                             "batches: give data=")
        if images < 1:
            raise ValueError(f"BatchNormStatistics: images={images}; expected >= 1")
        self.data = data
        self.images = images
        self.comm = comm
        self.per_replica_batch = per_replica_batch
        self.micro_batches = micro_batches
        self.mode = "precise" if mode == "auto" and data is not None else (
            "ema" if mode == "auto" else mode)
        self.statistics: bn_statistics.Statistics | None = None

    def _batches(self) -> Iterable[Any]:
        data = self.data
        return data() if callable(data) else iter(data)  # type: ignore[arg-type]

    def _build(self) -> bn_statistics.Statistics:
        tf_strategy = getattr(self.model, "_distribute_strategy", None)
        workers, all_sum = _collectives(self.comm, tf_strategy)
        replicas = int(tf_strategy.num_replicas_in_sync) if tf_strategy is not None else workers
        local = max(1, replicas // workers)
        per_replica = self.per_replica_batch
        if not per_replica and self.mode == "precise":
            first = next(iter(self._batches()))
            rows = int((first[0] if isinstance(first, (tuple, list)) else first).shape[0])
            per_replica = max(1, rows // (local * self.micro_batches))
        recomputer = bn_statistics.Recomputer(self.model, all_sum, per_replica or 1, local,
                                              replicas, tf_strategy)
        return bn_statistics.Statistics(self.mode, recomputer, self._batches, self.images,
                                        workers, lambda: optimizer_step(self.model),
                                        rank_zero.log)

    def refresh(self) -> None:
        """Brings the statistics up to date now (every worker must call it together)."""
        if self.statistics is None or self.statistics.recomputer.model is not self.model:
            self.statistics = self._build()
        self.statistics.refresh()

    def on_test_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.refresh()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.refresh()

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self.refresh()


def _collectives(comm: Collectives | None, tf_strategy: Any
                 ) -> tuple[int, Callable[[np.ndarray], np.ndarray]]:
    """The number of worker processes and a host sum over them (see the class's ``comm``)."""
    if comm is None:
        if tf_strategy is not None and int(tf_strategy.num_replicas_in_sync) > 1:
            from tfscale.exchange.tf_distribute import process_sum

            replicas = int(tf_strategy.num_replicas_in_sync)
            processes = replicas // max(1, len(tf_strategy.extended.worker_devices))
            return processes, lambda values: process_sum(tf_strategy, processes, values)
        else:
            comm = _running_horovod()
    if comm is None or comm.size == 1:
        return 1, lambda values: values
    return comm.size, lambda values: comm.all_reduce(values, "sum")


def _running_horovod() -> Collectives | None:
    try:
        import horovod.tensorflow as hvd
    except ImportError:
        return None
    if not hvd.is_initialized():
        return None
    from tfscale.exchange.horovod_runtime import HorovodCollectives

    return HorovodCollectives()
