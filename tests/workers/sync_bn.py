"""Worker for the synchronized batch-norm tests and the batch-norm statistics across workers.

One SGD step of a small model with batch norm (two blocks of convolution, batch norm and ReLU,
then global pooling and dense) under ``--strategy``, on a fixed global batch of ``GLOBAL``
examples whose two halves have clearly different statistics; each replica reads its contiguous
slice. Every rank builds the model from the same seed. The step runs once per ``--variants``
entry, each on a fresh model: ``off`` (ordinary batch norm), ``all`` (``--sync_bn``) or a group
size ``G`` (``--sync_bn --sync_bn_group=G``). For each, every process writes
``OUT/<variant>/rank<R>.npz``:

- ``moments``: [local replicas, 2, channels], the batch mean and variance that the first
  batch-norm layer of each of its replicas normalized with;
- ``loss``: [local replicas], each replica's mean loss on its slice;
- ``w0``, ``w1``, ...: the trainable weights after the step (they reveal the gradients);
- ``precise0``, ``ema1``, ``precise1``: both batch-norm layers' moving means and variances,
  concatenated: recomputed (:class:`tfscale.training.bn_statistics.Recomputer`) on the initial
  weights
  over ``STATS_STEPS`` global batches of the same kind (each replica normalizing its
  ``--stats_batch`` rows, default its share of the batch), after the step as Keras' moving
  averages left them, and recomputed after the step.

    python -m tests.workers.sync_bn --strategy horovod --variants off,all,1 --out DIR
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfscale.cli.command import import_tensorflow  # noqa: E402

import_tensorflow()  # Keras without matplotlib (tests/workers/__init__.py)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfscale.cli.command import skip_the_last_collection  # noqa: E402
from tfscale.config.train_config import TrainConfig  # noqa: E402
from tfscale.strategies import Strategy, create, running  # noqa: E402
from tfscale.training.bn_statistics import Recomputer, tracked_layers  # noqa: E402
from tfscale.training.sync_bn import synchronize_under_strategy  # noqa: E402
from tfscale.training.trainer import configure_runtime  # noqa: E402

SHAPE, CLASSES, CHANNELS, GLOBAL, STATS_STEPS = (8, 8, 3), 3, 4, 8, 3


def global_batch(seed: int = 5) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.random((GLOBAL, *SHAPE), dtype=np.float32)
    x[GLOBAL // 2:] = 3 * x[GLOBAL // 2:] + 2  # the second half: another mean and variance
    return x, rng.integers(0, CLASSES, GLOBAL).astype(np.int32)


def build_model() -> keras.Model:
    keras.utils.set_random_seed(11)
    inputs = keras.Input(shape=SHAPE)
    x = inputs
    for _ in range(2):
        x = keras.layers.Conv2D(CHANNELS, 3, padding="same")(x)
        x = keras.layers.BatchNormalization()(x)
        x = keras.layers.ReLU()(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(CLASSES)(x))


class Recorder:
    """What each local replica's step computed, kept in variables created outside the
    strategy's scope (one copy per process, a row per local replica)."""

    def __init__(self, replicas: int) -> None:
        self.replicas = replicas
        self.moments = tf.Variable(tf.zeros([replicas, 2, CHANNELS]), trainable=False)
        self.loss = tf.Variable(tf.zeros([replicas]), trainable=False)

    def _record(self, variable: tf.Variable, value: tf.Tensor) -> None:
        context = tf.distribute.get_replica_context()
        if context is None:  # Keras's symbolic build, which only traces
            return
        row = tf.reshape(context.replica_id_in_sync_group % self.replicas, [1, 1])
        variable.scatter_nd_update(row, value[tf.newaxis])

    def record_moments(self, layer: keras.layers.BatchNormalization) -> None:
        moments = layer._moments

        def recorded(inputs: tf.Tensor, mask: tf.Tensor | None) -> Any:
            mean, variance = moments(inputs, mask)
            self._record(self.moments, tf.stack([mean, variance]))
            return mean, variance

        layer._moments = recorded

    def loss_fn(self) -> Any:
        cross_entropy = keras.losses.SparseCategoricalCrossentropy(from_logits=True,
                                                                   reduction=None)

        def loss(y_true: tf.Tensor, y_pred: tf.Tensor) -> tf.Tensor:
            per_example = cross_entropy(y_true, y_pred)
            self._record(self.loss, tf.reduce_mean(per_example))
            return per_example

        return loss


def train_step(strategy: Strategy, cfg: TrainConfig, variant: str, out: Path,
               stats_batch: int) -> None:
    x, y = global_batch()
    per_process = GLOBAL // strategy.size
    lo = strategy.rank * per_process
    data = tf.data.Dataset.from_tensor_slices((x[lo:lo + per_process], y[lo:lo + per_process]))
    recorder = Recorder(strategy.replicas_in_process)
    with strategy.scope():
        model = build_model()
        model.compile(optimizer=strategy.wrap_optimizer(keras.optimizers.SGD(0.5)),
                      loss=recorder.loss_fn())
        if variant != "off":
            group = 0 if variant == "all" else int(variant)
            synchronize_under_strategy(model, strategy,
                                       cfg.replace(sync_bn=True, sync_bn_group=group))
    recomputer = Recomputer(model, lambda v: strategy.all_reduce(v, "sum"),
                            stats_batch or GLOBAL // strategy.num_replicas,
                            strategy.replicas_in_process, strategy.num_replicas,
                            getattr(strategy, "tf_strategy", None))
    stats = [global_batch(seed)[0][lo:lo + per_process] for seed in range(STATS_STEPS)]
    precise0 = statistics(model, recomputer, stats)
    recorder.record_moments(next(layer for layer in model.layers
                                 if isinstance(layer, keras.layers.BatchNormalization)))
    model.fit(strategy.distribute_dataset(data.batch(per_process)), epochs=1, steps_per_epoch=1,
              callbacks=strategy.callbacks(), verbose=0, shuffle=False)
    moments, loss = recorder.moments.numpy(), recorder.loss.numpy()
    ema1 = statistics(model)
    precise1 = statistics(model, recomputer, stats)
    folder = out / variant
    folder.mkdir(parents=True, exist_ok=True)
    weights = {f"w{i}": np.asarray(w.numpy(), np.float64)
               for i, w in enumerate(model.trainable_weights)}
    np.savez(folder / f"rank{strategy.rank}.npz", moments=moments, loss=loss,
             precise0=precise0, ema1=ema1, precise1=precise1, **weights)


def statistics(model: keras.Model, recomputer: Recomputer | None = None,
               batches: list[np.ndarray] | None = None) -> np.ndarray:
    """The batch-norm layers' moving means and variances, recomputed first over ``batches``
    (this process's rows of each global batch) when a recomputer is given."""
    if recomputer is not None and batches is not None:
        report = recomputer.recompute(iter(batches), images=GLOBAL * STATS_STEPS)
        assert report.layers == 2 and report.images == GLOBAL * STATS_STEPS, report
    return np.concatenate([np.asarray(v.numpy(), np.float64) for layer in tracked_layers(model)
                           for v in (layer.moving_mean, layer.moving_variance)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--cpu_replicas", type=int, default=0)
    parser.add_argument("--variants", default="off,all", help="off, all or group sizes")
    parser.add_argument("--stats_batch", type=int, default=0,
                        help="rows each replica normalizes in the statistics pass (0: its share "
                             "of the global batch)")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cfg = TrainConfig(strategy=args.strategy, cpu_replicas=args.cpu_replicas,
                      model_dir=args.out)
    configure_runtime(cfg)
    with running(create(cfg)) as strategy:
        for variant in args.variants.split(","):
            train_step(strategy, cfg, variant, Path(args.out), args.stats_batch)


if __name__ == "__main__":
    main()
    skip_the_last_collection()  # a probe: exit without Python's last collection
