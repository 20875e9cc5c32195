"""Worker for the gradient-lag tests: a linear model whose every update has a NumPy formula.

Trains ``Dense(OUTPUTS)`` with mean squared error and plain SGD under ``--strategy`` for
``--steps`` steps on fixed data: step ``i``'s global batch is the same whatever the strategy,
and each worker reads its own contiguous slice of it. All ranks start from the same weights
(seed 5). Each process writes to ``OUT/rank<R>.npz`` the initial kernel and bias and the
kernel and bias after every step (``kernels[s]`` after step s+1).

    python -m tests.workers.gradient_lag --strategy horovod --lag 1 --steps 4 --batch 3 --out DIR
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfscale.cli.command import import_tensorflow  # noqa: E402

import_tensorflow()  # Keras without matplotlib (tests/workers/__init__.py)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfscale.cli.command import skip_the_last_collection  # noqa: E402
from tfscale.config.train_config import TrainConfig  # noqa: E402
from tfscale.strategies import create, running  # noqa: E402
from tfscale.training.trainer import configure_runtime  # noqa: E402

INPUTS, OUTPUTS, LEARNING_RATE = 5, 2, 0.1


def global_batches(steps: int, global_batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(99)
    x = rng.normal(size=(steps, global_batch, INPUTS)).astype(np.float32)
    y = rng.normal(size=(steps, global_batch, OUTPUTS)).astype(np.float32)
    return x, y


def linear_model() -> keras.Model:
    keras.utils.set_random_seed(5)
    return keras.Sequential([keras.Input((INPUTS,)), keras.layers.Dense(OUTPUTS)])


class RecordWeights(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.kernels: list[np.ndarray] = []
        self.biases: list[np.ndarray] = []

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        kernel, bias = self.model.get_weights()
        self.kernels.append(kernel)
        self.biases.append(bias)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch", type=int, default=3, help="per-worker batch")
    parser.add_argument("--lag", type=int, default=0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    cfg = TrainConfig(model="mlp", strategy=args.strategy, batch_size=args.batch,
                      gradient_lag=args.lag, model_dir=args.out)
    configure_runtime(cfg)
    with running(create(cfg)) as strategy:
        x, y = global_batches(args.steps, args.batch * strategy.num_replicas)
        lo = strategy.rank * args.batch
        data = tf.data.Dataset.from_tensor_slices((x[:, lo:lo + args.batch],
                                                   y[:, lo:lo + args.batch]))
        with strategy.scope():
            model = linear_model()
            initial = model.get_weights()
            model.compile(optimizer=strategy.wrap_optimizer(keras.optimizers.SGD(LEARNING_RATE)),
                          loss="mse")
        record = RecordWeights()
        model.fit(strategy.distribute_dataset(data), epochs=1, steps_per_epoch=args.steps,
                  callbacks=[*strategy.callbacks(), record], verbose=0, shuffle=False)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        np.savez(Path(args.out) / f"rank{strategy.rank}.npz", kernel0=initial[0],
                 bias0=initial[1], kernels=np.stack(record.kernels),
                 biases=np.stack(record.biases))


if __name__ == "__main__":
    main()
    skip_the_last_collection()  # a probe: exit without Python's last collection
