"""Worker for the strategy-equivalence tests.

Trains ``tiny_cnn`` (no batch norm) with plain SGD for ``--steps`` steps under ``--strategy``,
on fixed data: step ``i``'s global batch is the same whatever the strategy, and each replica
reads its own contiguous slice of it. Workers start from different random weights (seed +
rank), so identical results also prove the initial broadcast. Each process writes its final
weights to ``OUT/rank<R>.npz``.

    python -m tests.workers.equivalence --strategy horovod --steps 1 --batch 4 --out DIR
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from models.small import tiny_cnn  # noqa: E402
from tfscale.config import TrainConfig  # noqa: E402
from tfscale.strategies import create, running  # noqa: E402
from tfscale.trainer import configure_runtime  # noqa: E402

SHAPE, CLASSES = (8, 8, 3), 3


def global_batches(steps: int, global_batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1234)
    x = rng.random((steps, global_batch, *SHAPE), dtype=np.float32)
    y = rng.integers(0, CLASSES, (steps, global_batch)).astype(np.int32)
    return x, y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--batch", type=int, default=4, help="per-replica batch")
    parser.add_argument("--cpu_replicas", type=int, default=0)
    parser.add_argument("--ddl_local_size", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cfg = TrainConfig(model="tiny_cnn", strategy=args.strategy, batch_size=args.batch,
                      image_size=SHAPE[0], input_channels=SHAPE[2], num_classes=CLASSES,
                      cpu_replicas=args.cpu_replicas, ddl_local_size=args.ddl_local_size,
                      model_dir=args.out)
    configure_runtime(cfg)
    with running(create(cfg)) as strategy:
        x, y = global_batches(args.steps, args.batch * strategy.num_replicas)
        per_process = args.batch * strategy.replicas_in_process
        lo = strategy.rank * per_process
        data = tf.data.Dataset.from_tensor_slices(
            (x[:, lo:lo + per_process], y[:, lo:lo + per_process]))
        keras.utils.set_random_seed(100 + strategy.rank)
        with strategy.scope():
            model = tiny_cnn(SHAPE, CLASSES)
            optimizer = strategy.wrap_optimizer(keras.optimizers.SGD(0.5))
            model.compile(optimizer=optimizer,
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
            strategy.prepare_model(model)
        model.fit(strategy.distribute_dataset(data), epochs=1, steps_per_epoch=args.steps,
                  callbacks=strategy.callbacks(), verbose=0, shuffle=False)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        np.savez(Path(args.out) / f"rank{strategy.rank}.npz",
                 *[np.asarray(w) for w in model.get_weights()])


if __name__ == "__main__":
    main()
