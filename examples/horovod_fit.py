"""A plain Keras 3 ``model.fit`` script made data-parallel with Horovod and tfscale's callbacks,
without ``tfscale.train``.

    horovodrun --gloo -np 2 python examples/horovod_fit.py --out /tmp/horovod_fit

Each worker reads its own data; gradients are averaged by tfscale's Horovod optimizer wrapper;
the callbacks broadcast rank 0's initial state, average the logged metrics, warm the learning
rate up to the linearly scaled one, measure throughput, and keep TensorBoard logs and model
checkpoints on the chief only.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402

from tfscale.callbacks import (  # noqa: E402
    BroadcastInitialState,
    ChiefOnly,
    LearningRateWarmup,
    MetricAverage,
    ThroughputMeter,
)
from tfscale.strategies.horovod import distributed_optimizer  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for logs and weights")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch_size", type=int, default=16, help="per worker")
    args = parser.parse_args()
    out = Path(args.out)

    hvd.init()
    keras.utils.set_random_seed(hvd.rank())  # different on purpose: the broadcast aligns them
    rng = np.random.default_rng(hvd.rank())
    x = rng.normal(size=(256, 20)).astype("float32")
    y = (x[:, :5].sum(axis=1) > 0).astype("int32")

    model = keras.Sequential([keras.Input((20,)), keras.layers.Dense(32, activation="relu"),
                              keras.layers.Dense(2)])
    base_lr = 0.05
    optimizer = distributed_optimizer(keras.optimizers.SGD(base_lr * hvd.size(), momentum=0.9))
    model.compile(optimizer=optimizer, metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    meter = ThroughputMeter(global_batch=args.batch_size * hvd.size())
    callbacks = [
        BroadcastInitialState(),
        MetricAverage(),
        LearningRateWarmup(base_lr * hvd.size(), warmup_steps=8, num_workers=hvd.size()),
        meter,
        ChiefOnly(keras.callbacks.TensorBoard(str(out / "tensorboard"), write_graph=False)),
        ChiefOnly(keras.callbacks.ModelCheckpoint(str(out / "model.keras"))),
    ]
    history = model.fit(x, y, batch_size=args.batch_size, epochs=args.epochs,
                        callbacks=callbacks, verbose=2 if hvd.rank() == 0 else 0)
    np.savez(out / f"weights_rank{hvd.rank()}.npz", *model.get_weights())
    if hvd.rank() == 0:
        print(f"workers {hvd.size()}  final loss {history.history['loss'][-1]:.4f}  "
              f"accuracy {history.history['accuracy'][-1]:.3f}  "
              f"{meter.images_per_sec:.0f} examples/s")


if __name__ == "__main__":
    main()
