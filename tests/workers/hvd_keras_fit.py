"""Worker for the public-Horovod tests: a ``horovod.tensorflow.keras``-style script on
``tfscale.horovod``, written the way Horovod's Keras examples are.

``--mode=train``: each worker trains a small CNN on its own half of scikit-learn's digits;
the model declares no input shape (Keras builds it in the first step) and each worker seeds
itself differently, so identical final weights prove the broadcast and the all-reduce. The
chief keeps the best model and saves the final one. ``--mode=accumulate``: one optimizer step
of plain SGD from ``--passes`` backward passes per worker, on fixed data, for comparison with
one step on all the data at once (with ``TFSCALE_NODE_EXCHANGE=collectives``, Horovod carries
the gradients). Each worker writes ``OUT/rank<R>.npz`` (trainable weights) and
``OUT/rank<R>.json`` (history, iterations, the ops of Horovod's grouped all-reduces).

    horovodrun --gloo -np 2 python -m tests.workers.hvd_keras_fit --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfscale.horovod as hvd  # noqa: E402

ACCUMULATE_BATCH = 4


def accumulation_data(passes: int, workers: int) -> tuple[np.ndarray, np.ndarray]:
    """The whole job's data for one optimizer step: ``passes x workers x ACCUMULATE_BATCH``
    examples; worker ``r``'s pass ``p`` reads block ``[p, r]``."""
    rng = np.random.default_rng(1234)
    x = rng.normal(size=(passes, workers, ACCUMULATE_BATCH, 6)).astype("float32")
    y = rng.integers(0, 3, size=(passes, workers, ACCUMULATE_BATCH)).astype("int32")
    return x, y


def dense_model() -> keras.Model:
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(3)])


def train(out: Path, loss_scale: bool, epochs: int) -> keras.callbacks.History:
    from bench.digits import load_digits

    grey, target = load_digits()
    images = (grey[hvd.rank()::hvd.size(), ..., np.newaxis] / 16.0).astype("float32")
    labels = target[hvd.rank()::hvd.size()]
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).repeat().shuffle(
        256, seed=hvd.rank()).batch(32)
    keras.utils.set_random_seed(hvd.rank())  # different on purpose: the broadcast aligns them
    model = keras.Sequential([
        keras.layers.Conv2D(8, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(10, activation="softmax"),
    ])
    scaled_lr = 0.002 * hvd.size()
    opt: keras.optimizers.Optimizer = keras.optimizers.Adam(scaled_lr)
    compression = hvd.Compression.fp16
    if loss_scale:
        # Scaled gradients would overflow float16 in the exchange: send them as they are.
        opt, compression = keras.optimizers.LossScaleOptimizer(opt), hvd.Compression.none
    opt = hvd.DistributedOptimizer(opt, compression=compression)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(), optimizer=opt,
                  metrics=["accuracy"])
    callbacks = [
        hvd.callbacks.BroadcastGlobalVariablesCallback(0),
        hvd.callbacks.MetricAverageCallback(),
        hvd.callbacks.LearningRateWarmupCallback(initial_lr=scaled_lr, warmup_epochs=1,
                                                 verbose=1),
        hvd.callbacks.BestModelCheckpoint(str(out / "best.keras"), monitor="loss"),
    ]
    history = model.fit(dataset, steps_per_epoch=20 // hvd.size(), epochs=epochs,
                        callbacks=callbacks, verbose=0)
    if hvd.rank() == 0:
        model.save(out / "model.keras")
    return history


def record_ops(ops: set[str]) -> None:
    """Adds to ``ops`` the op of each of Horovod's grouped all-reduces as it is traced."""
    import horovod.tensorflow as horovod

    grouped = horovod.grouped_allreduce

    def recorded(*args, **kwargs):  # type: ignore[no-untyped-def]
        op = kwargs.get("op")
        ops.add("Sum" if op == horovod.Sum else "Average" if op == horovod.Average
                else repr(op))
        return grouped(*args, **kwargs)

    horovod.grouped_allreduce = recorded


def accumulate(out: Path, passes: int) -> keras.callbacks.History:
    x, y = accumulation_data(passes, hvd.size())
    keras.utils.set_random_seed(hvd.rank())
    model = dense_model()
    if hvd.rank() == 0:
        np.savez(out / "initial.npz", *model.get_weights())
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.1), backward_passes_per_step=passes,
                                   average_aggregated_gradients=True)
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=opt)
    r = hvd.rank()
    return model.fit(x[:, r].reshape(-1, 6), y[:, r].reshape(-1), batch_size=ACCUMULATE_BATCH,
                     epochs=1, shuffle=False, verbose=0,
                     callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0)])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--mode", choices=("train", "accumulate"), default="train")
    parser.add_argument("--loss_scale", action="store_true")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--passes", type=int, default=2)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    hvd.init()
    ops: set[str] = set()
    record_ops(ops)
    history = (train(out, args.loss_scale, args.epochs) if args.mode == "train"
               else accumulate(out, args.passes))
    model = history.model
    np.savez(out / f"rank{hvd.rank()}.npz", *[np.asarray(v) for v in model.trainable_weights])
    (out / f"rank{hvd.rank()}.json").write_text(json.dumps({
        "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
        "iterations": int(model.optimizer.iterations.numpy()),
        "horovod_ops": sorted(ops),  # of the gradients' all-reduces where Horovod carries them
        "allreduce": float(hvd.allreduce(np.float32(hvd.rank() + 1), op=hvd.Sum).numpy()),
        "allgather": hvd.allgather(np.array([hvd.rank()])).numpy().tolist(),
        "broadcast": float(hvd.broadcast(np.float32(hvd.rank() + 5), root_rank=1).numpy()),
    }))
    hvd.shutdown()


if __name__ == "__main__":
    main()
