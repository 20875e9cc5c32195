"""Batch-norm population statistics that do not depend on the step count or the worker count.

Keras' ``BatchNormalization`` normalizes a training batch with the batch's own mean and
variance, and keeps for inference an exponential moving average of them (momentum 0.99). After
``S`` steps that average still holds ``0.99**S`` of its initial (0, 1) statistics (17% after
176 steps) and mixes in statistics of weights long gone; under data parallelism each worker
averages only its own shard, and the saved model keeps the chief's. So a run that takes fewer
steps, because more workers share each epoch, evaluates and saves a model whose inference
statistics are stale: real digits, 8 epochs at global batch 64, validate at 0.10-0.35 with the
moving averages and at 0.95 with recomputed ones.

:func:`recompute` replaces the moving averages by the population statistics of the current
weights ("precise BN", Wu & Johnson, "Rethinking 'Batch' in BatchNorm", 2021): with the weights
fixed, a number of training batches pass forward in training mode, each replica normalizing
its batch as in training (its own per-replica batch, or its ``--sync_bn`` group), and each
batch-norm layer adds up, per channel, the count, the sum and the sum of squares of its inputs
(from the moments the layer computes anyway). One all-reduce of those sums over every worker
gives each layer's exact mean and variance over all the images, so every worker holds the same
statistics, and N workers equal one process that reads the same batches.

:func:`agree` is the cheap alternative for ``--bn_statistics=ema``: one all-reduce that gives
every worker the pooled moving averages, so that evaluation, the checkpoint and the saved model
agree with each other.

Layers that are frozen (``trainable=False``) normalize with their moving statistics in
training too and are left as they are. Under mixed precision the layer's statistics are
float32 (Keras upcasts its inputs); the sums here are float64.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from tfscale.config.train_config import BN_STATISTICS

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

MODES = BN_STATISTICS  # auto, ema, precise
DEFAULT_IMAGES = 1024  # Wu & Johnson: 10^3-10^4 images estimate the population well
KEEP_BYTES = 256 << 20  # training batches kept in memory between recomputations, at most

# A host sum over every worker of a float64 vector (the strategy's all_reduce with "sum").
AllSum = Callable[[np.ndarray], np.ndarray]


@dataclasses.dataclass(frozen=True)
class Report:
    """What one recomputation did.

    Attributes:
        layers: batch-norm layers whose statistics were replaced.
        images: images every layer's statistics are over (all workers together).
        batches: forward passes of each replica.
        seconds: wall time of the passes and the all-reduce.
        unreached: names of trainable batch-norm layers no forward pass went through (kept).
    """

    layers: int
    images: int
    batches: int
    seconds: float
    unreached: tuple[str, ...] = ()

    def describe(self) -> str:
        if not self.layers and not self.unreached:
            return "batch-norm statistics: the model has no trainable batch-norm layer"
        text = (f"batch-norm statistics recomputed over {self.images} training images "
                f"({self.batches} batch(es) per replica) for {self.layers} layers in "
                f"{self.seconds:.2f} s")
        if self.unreached:
            text += (f"; {len(self.unreached)} layer(s) no training pass reached kept their "
                     f"moving averages: {', '.join(self.unreached[:5])}")
        return text


def batch_norm_layers(model: keras.Layer) -> list[keras.layers.BatchNormalization]:
    """Every batch-norm layer of ``model``, those of nested models and layers included."""
    import keras

    return [layer for layer in model._flatten_layers()
            if isinstance(layer, keras.layers.BatchNormalization)]


def tracked_layers(model: keras.Layer) -> list[keras.layers.BatchNormalization]:
    """The batch-norm layers of ``model`` (nested ones too) that normalize training batches
    with batch statistics: built and trainable."""
    return [layer for layer in batch_norm_layers(model)
            if layer.built and layer.trainable and layer.moving_mean is not None]


def batches_per_replica(images: int, per_replica_batch: int, num_replicas: int) -> int:
    """Forward passes per replica so that all replicas together see at least ``images``."""
    return max(1, -(-images // (per_replica_batch * num_replicas)))


class Recomputer:
    """Recomputes the statistics of one model's batch-norm layers (see the module docstring).

    Args:
        model: the model (built; nested models and layers are included).
        all_sum: the host sum over every worker (identity for one process).
        per_replica_batch: examples each replica normalizes together, as in training.
        replicas_in_process: replicas this process runs (``MirroredStrategy``: several); each
            takes its own consecutive ``per_replica_batch`` rows of a process batch.
        num_replicas: replicas of the whole job.
        tf_strategy: the ``tf.distribute`` strategy the model was built under (None: the
            default one), through which each local replica runs its forward pass.
    """

    def __init__(self, model: keras.Model, all_sum: AllSum, per_replica_batch: int,
                 replicas_in_process: int = 1, num_replicas: int = 1,
                 tf_strategy: tf.distribute.Strategy | None = None) -> None:
        self.model = model
        self.layers = tracked_layers(model)
        self.all_sum = all_sum
        self.per_replica_batch = per_replica_batch
        self.replicas_in_process = replicas_in_process
        self.num_replicas = num_replicas
        self.tf_strategy = tf_strategy
        self._sums: list[Any] = []
        self._step: Any = None

    def recompute(self, batches: Iterable[Any], images: int) -> Report:
        """Replaces the moving mean and variance of every tracked layer by those of the
        current weights over at least ``images`` images of ``batches``, a source of this
        process's training batches (``images`` or ``(images, labels, ...)``, ``replicas x
        per-replica batch`` rows, or a multiple of it: micro-batches). Every worker must call
        it together, with as many batches (it ends in one collective).

        Raises:
            ValueError: when ``batches`` ends before the images are read, or a batch's rows are
                not a multiple of ``replicas x per-replica batch``.
        """
        if not self.layers:
            return Report(0, 0, 0, 0.0)
        start = time.perf_counter()
        wanted = batches_per_replica(images, self.per_replica_batch, self.num_replicas)
        rows = self.per_replica_batch * self.replicas_in_process
        self._reset()
        done = 0
        with self._recording():
            for batch in batches:
                x = batch[0] if isinstance(batch, (tuple, list)) else batch
                if int(x.shape[0]) % rows:
                    raise ValueError(
                        f"batch-norm statistics: a training batch of {x.shape[0]} rows is not "
                        f"a multiple of {self.replicas_in_process} replica(s) x "
                        f"{self.per_replica_batch} examples")
                for lo in range(0, int(x.shape[0]), rows):
                    if done == wanted:
                        break
                    self._step(x[lo:lo + rows])
                    done += 1
                if done == wanted:
                    break
        if done < wanted:
            raise ValueError(f"batch-norm statistics: the training data ended after {done} of "
                             f"{wanted} batches per replica; give fewer --bn_statistics_images")
        unreached = self._assign(self.all_sum(self._local_sums()))
        return Report(len(self.layers) - len(unreached),
                      wanted * self.per_replica_batch * self.num_replicas, wanted,
                      time.perf_counter() - start, unreached)

    def _reset(self) -> None:
        import tensorflow as tf

        if not self._sums:
            # Outside any strategy's scope: one plain variable per layer in this process,
            # a row per local replica: [count, sum (C), sum of squares (C)].
            with tf.init_scope():
                self._sums = [tf.Variable(
                    tf.zeros([self.replicas_in_process, 1 + 2 * int(layer.moving_mean.shape[0])],
                             tf.float64), trainable=False) for layer in self.layers]
        for sums in self._sums:
            sums.assign(tf.zeros_like(sums))

    @contextlib.contextmanager
    def _recording(self) -> Iterator[None]:
        """Each tracked layer's ``_moments`` also adds its batch's sums to its row, while
        the step traces; the model's forward pass is the plain one (an XLA-compiled
        ``call``, traced once for training, would not trace the recording)."""
        saved = [vars(layer).get("_moments") for layer in self.layers]
        call = vars(self.model).get("call")
        plain_call = getattr(call, "python_function", None)
        for layer, sums in zip(self.layers, self._sums, strict=True):
            layer._moments = _recording_moments(layer, layer._moments, sums,
                                                self.replicas_in_process)
        if plain_call is not None:
            self.model.call = plain_call
        if self._step is None:
            self._step = self._make_step()
        try:
            yield
        finally:
            for layer, own in zip(self.layers, saved, strict=True):
                if own is None:
                    del layer._moments
                else:
                    layer._moments = own
            if plain_call is not None:
                self.model.call = call

    def _make_step(self) -> Any:
        import tensorflow as tf

        model, batch = self.model, self.per_replica_batch
        strategy = self.tf_strategy or tf.distribute.get_strategy()
        replicas = self.replicas_in_process

        def replica_fn(x: tf.Tensor) -> None:
            index = tf.distribute.get_replica_context().replica_id_in_sync_group % replicas
            model(x[index * batch:(index + 1) * batch], training=True)

        @tf.function(reduce_retracing=True)
        def step(x: tf.Tensor) -> None:
            strategy.run(replica_fn, args=(x,))

        return step

    def _local_sums(self) -> np.ndarray:
        """This process's sums, its replicas' rows added, every layer's concatenated."""
        return np.concatenate([np.asarray(s.numpy()).sum(axis=0) for s in self._sums])

    def _assign(self, totals: np.ndarray) -> tuple[str, ...]:
        unreached = []
        offset = 0
        for layer in self.layers:
            channels = int(layer.moving_mean.shape[0])
            count, total, squares = np.split(totals[offset:offset + 1 + 2 * channels],
                                             [1, 1 + channels])
            offset += 1 + 2 * channels
            if count[0] <= 0:
                unreached.append(layer.name)
                continue
            mean = total / count[0]
            variance = np.maximum(squares / count[0] - mean * mean, 0.0)
            _set_statistics(layer, mean, variance)
        return tuple(unreached)


def _recording_moments(layer: keras.layers.BatchNormalization, moments: Callable[..., Any],
                       sums: tf.Variable, replicas: int) -> Callable[..., Any]:
    """``moments`` (the layer's own, or ``--sync_bn``'s), which also adds the batch's count,
    sum and sum of squares per channel to this replica's row of ``sums``.

    From the batch's mean m and variance v over n positions: sum = n m, sum of squares
    = n (v + m**2). Under ``--sync_bn`` m and v are the group's and n this replica's count;
    the sums over all replicas then weigh each group's moments by its count, as they should.
    """

    def recording(inputs: tf.Tensor, mask: tf.Tensor | None) -> tuple[tf.Tensor, tf.Tensor]:
        import tensorflow as tf

        mean, variance = moments(inputs, mask)
        channels = tf.shape(mean)[-1]
        if mask is None:
            count = tf.cast(tf.size(inputs) // channels, tf.float64)
        else:
            count = tf.reduce_sum(tf.cast(mask, tf.float64))
        m = tf.reshape(tf.cast(mean, tf.float64), [-1])
        v = tf.reshape(tf.cast(variance, tf.float64), [-1])
        row = tf.concat([count[tf.newaxis], count * m, count * (v + m * m)], axis=0)
        context = tf.distribute.get_replica_context()
        index = 0 if context is None else context.replica_id_in_sync_group % replicas
        sums.scatter_nd_add(tf.reshape(index, [1, 1]), row[tf.newaxis])
        return mean, variance

    return recording


def _set_statistics(layer: keras.layers.BatchNormalization, mean: np.ndarray,
                    variance: np.ndarray) -> None:
    dtype = layer.moving_mean.dtype
    layer.moving_mean.assign(mean.astype(dtype))
    layer.moving_variance.assign(variance.astype(dtype))
    if getattr(layer, "renorm", False):
        layer.moving_stddev.assign(np.sqrt(variance).astype(dtype))


def agree(model: keras.Model, all_sum: AllSum, workers: int) -> int:
    """``--bn_statistics=ema`` with several workers: every worker's moving averages become the
    pooled ones (the mean of the means; the variance of the workers' populations together,
    equal weights), so that all evaluate and save the same model. Returns the layers agreed."""
    layers = tracked_layers(model)
    if workers < 2 or not layers:
        return 0
    means = [np.asarray(layer.moving_mean.numpy(), np.float64) for layer in layers]
    variances = [np.asarray(layer.moving_variance.numpy(), np.float64) for layer in layers]
    local = np.concatenate([*means, *[v + m * m for m, v in zip(means, variances, strict=True)]])
    pooled = all_sum(local) / workers
    sizes = [len(m) for m in means]
    split = np.split(pooled, np.cumsum(sizes + sizes)[:-1])
    for layer, mean, squares in zip(layers, split[:len(layers)], split[len(layers):],
                                    strict=True):
        _set_statistics(layer, mean, np.maximum(squares - mean * mean, 0.0))
    return len(layers)


class Statistics:
    """When and how a run brings its batch-norm statistics up to date: before each evaluation
    and before the final checkpoint and the saved model, once per step (see ``--bn_statistics``).

    Args:
        mode: ``ema`` or ``precise`` (resolved, see :func:`resolve_mode`).
        recomputer: the model's :class:`Recomputer`.
        batches: makes a new iterator of this process's training batches; every refresh reads
            the same first ones, so a resumed run ends with the statistics of an uninterrupted
            one.
        images: images per recomputation, all workers together.
        workers: processes of the job (for ``ema``'s pooling).
        step: the model's current optimizer step.
        log: where the chief says what each recomputation did.
    """

    def __init__(self, mode: str, recomputer: Recomputer, batches: Callable[[], Iterable[Any]],
                 images: int, workers: int, step: Callable[[], int],
                 log: Callable[[str], object]) -> None:
        self.mode = mode
        self.recomputer = recomputer
        self.batches = batches
        self.images = images
        self.workers = workers
        self.step = step
        self.log = log
        self.fresh_at = -1
        self.reports: list[Report] = []
        self._kept: list[Any] | None = None

    def _source(self) -> Iterator[Any]:
        """The training batches: read once, then, where they fit in :data:`KEEP_BYTES`, kept in
        memory (restarting a training pipeline fills its shuffle buffer again: 0.35 s of the
        0.8 s a recomputation took on 32-px digits)."""
        if self._kept is not None:
            yield from self._kept
            return
        kept: list[Any] | None = []
        size = 0
        for batch in repeat_batches(self.batches):
            images = batch[0] if isinstance(batch, (tuple, list)) else batch
            dtype = images.dtype
            size += int(np.prod(images.shape)) * (getattr(dtype, "itemsize", 0) or dtype.size)
            if kept is not None:
                kept = kept + [images] if size <= KEEP_BYTES else None
            self._kept = kept
            yield images

    def refresh(self) -> None:
        """Brings the statistics up to date for the current step (nothing if they are)."""
        step = self.step()
        if step == self.fresh_at:
            return
        self.fresh_at = step
        if self.mode == "ema":
            agree(self.recomputer.model, self.recomputer.all_sum, self.workers)
            return
        report = self.recomputer.recompute(self._source(), self.images)
        if report.layers or report.unreached:
            self.reports.append(report)
            self.log(f"step {step}: {report.describe()}")


def resolve_mode(mode: str, reads_data: bool) -> str:
    """``auto``: ``precise`` on data read from files (what evaluation and export use),
    ``ema`` on generated data (``synthetic``: throughput runs, nothing to evaluate)."""
    if mode not in MODES:
        raise ValueError(f"--bn_statistics={mode!r}; expected one of {', '.join(MODES)}")
    if mode == "auto":
        return "precise" if reads_data else "ema"
    return mode


def repeat_batches(make: Callable[[], Iterable[Any]]) -> Iterator[Any]:
    """The batches of ``make()`` again and again (a shard smaller than the images wanted is
    read more than once, so that every worker gets as many batches); ends if it is empty."""
    while True:
        empty = True
        for batch in make():
            empty = False
            yield batch
        if empty:
            return


__all__: Sequence[str] = ("DEFAULT_IMAGES", "MODES", "Recomputer", "Report", "Statistics",
                          "agree", "batch_norm_layers", "batches_per_replica", "repeat_batches",
                          "resolve_mode", "tracked_layers")
