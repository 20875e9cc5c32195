"""Worker for the public-MultiWorkerMirroredStrategy tests: a ``tf.keras`` multi-worker script
in the style of TensorFlow's multi-worker Keras tutorial, plus ``tfscale.multiworker.enable()``.

Every worker builds the same pipeline over scikit-learn's digits with the global batch;
Keras shards it across workers. With ``--per-worker`` each worker reads its own shard in
per-worker batches instead, marked with ``tfscale.multiworker.per_worker_dataset``. The
model is built and compiled in ``strategy.scope()``. Each worker writes ``OUT/rank<R>.npz``
(weights) and ``OUT/rank<R>.json`` (history, evaluation); the chief saves ``OUT/model.keras``.
``--no-fix`` leaves Keras as it is.

    TF_CONFIG=... python -m tests.workers.mwms_fit --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfscale.multiworker  # noqa: E402

PER_WORKER_BATCH = 32


def digits_dataset(batch: int, shard: tuple[int, int] = (1, 0)) -> tf.data.Dataset:
    """Digits in batches of ``batch``; ``shard``: (workers, rank), this worker's part only."""
    from bench.digits import load_digits

    images, target = load_digits()
    x = (images / 16.0).astype(np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((x, target.astype(np.int64)))
    return dataset.shard(*shard).shuffle(2000, seed=1).repeat().batch(batch)


def build_and_compile_model() -> tf.keras.Model:
    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=(8, 8)),
        tf.keras.layers.Reshape(target_shape=(8, 8, 1)),
        tf.keras.layers.Conv2D(8, 3, activation="relu"),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(32, activation="relu"),
        tf.keras.layers.Dense(10),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.SGD(learning_rate=0.1, momentum=0.9),
                  metrics=["accuracy"])
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--no-fix", dest="fix", action="store_false")
    parser.add_argument("--per-worker", action="store_true",
                        help="each worker reads its own shard in per-worker batches, marked "
                             "with tfscale.multiworker.per_worker_dataset")
    args = parser.parse_args()
    if args.fix:
        tfscale.multiworker.enable()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    tf_config = json.loads(os.environ["TF_CONFIG"])
    num_workers, rank = len(tf_config["cluster"]["worker"]), tf_config["task"]["index"]
    tf.keras.utils.set_random_seed(rank)  # the strategy broadcasts worker 0's initial values
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    if args.per_worker:
        dataset = tfscale.multiworker.per_worker_dataset(
            digits_dataset(PER_WORKER_BATCH, (num_workers, rank)))
    else:
        dataset = digits_dataset(PER_WORKER_BATCH * num_workers)
    with strategy.scope():
        model = build_and_compile_model()
    history = model.fit(dataset, epochs=3, steps_per_epoch=8, verbose=0)
    evaluation = model.evaluate(dataset, steps=4, verbose=0, return_dict=True)
    np.savez(out / f"rank{rank}.npz", *model.get_weights())
    (out / f"rank{rank}.json").write_text(json.dumps({
        "history": {k: [float(v) for v in vs] for k, vs in history.history.items()},
        "evaluation": {k: float(v) for k, v in evaluation.items()}}))
    if rank == 0:
        model.save(out / "model.keras")


if __name__ == "__main__":
    main()
