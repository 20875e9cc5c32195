"""A plain Keras 3 ``model.fit`` script made data-parallel with ``tfscale.horovod``, the
``horovod.tensorflow.keras`` API for Keras 3, without ``tfscale.train``.

    horovodrun --gloo -np 2 python examples/horovod_fit.py --out /tmp/horovod_fit

Each worker reads its own data; ``hvd.DistributedOptimizer`` averages the gradients; the
callbacks broadcast rank 0's initial state, average the logged metrics (before the callbacks
that read them), warm the learning rate up from the single-worker rate to the linearly scaled
one over the first half epoch, measure throughput, and keep TensorBoard logs and the best
model on the chief only.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

import tfscale.horovod as hvd  # noqa: E402
from tfscale.callbacks import ChiefOnly, ThroughputMeter  # noqa: E402


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
    scaled_lr = 0.05 * hvd.size()
    optimizer = hvd.DistributedOptimizer(keras.optimizers.SGD(scaled_lr, momentum=0.9))
    model.compile(optimizer=optimizer, metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    meter = ThroughputMeter(global_batch=args.batch_size * hvd.size())
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=0.5),
        meter,
        ChiefOnly(keras.callbacks.TensorBoard(str(out / "tensorboard"), write_graph=False)),
        hvd.callbacks.BestModelCheckpoint(str(out / "model.keras"), monitor="loss"),
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
