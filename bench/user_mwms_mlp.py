"""A user's own MultiWorkerMirroredStrategy script (as TensorFlow's multi-worker Keras tutorial
is written: the global batch, sharded by Keras) with ``tfscale.multiworker.enable()``: the
``mlp`` of bench/scaling.py on synthetic images, batch 64 per worker. bench/user_scripts.py
starts it with a TF_CONFIG per worker; worker 0 writes its images/s as JSON to ``--out``.

    python -m bench.user_scripts
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfscale.multiworker  # noqa: E402
from tfscale.callbacks import ThroughputMeter  # noqa: E402

PER_WORKER_BATCH, SIZE, CLASSES = 64, 32, 1000


def dataset(global_batch: int) -> tf.data.Dataset:
    rng = np.random.default_rng(0)
    images = rng.uniform(size=(4 * global_batch, SIZE, SIZE, 3)).astype("float32")
    labels = rng.integers(0, CLASSES, 4 * global_batch)
    return tf.data.Dataset.from_tensor_slices((images, labels)).batch(global_batch).cache() \
        .repeat()


def build_and_compile_model() -> tf.keras.Model:
    model = tf.keras.Sequential([
        tf.keras.layers.Input(shape=(SIZE, SIZE, 3)),
        tf.keras.layers.Flatten(),
        tf.keras.layers.Dense(512, activation="relu"),
        tf.keras.layers.Dense(512, activation="relu"),
        tf.keras.layers.Dense(CLASSES),
    ])
    model.compile(loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=tf.keras.optimizers.SGD(learning_rate=0.01, momentum=0.9),
                  metrics=["accuracy"])
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    tfscale.multiworker.enable()
    tf_config = json.loads(os.environ["TF_CONFIG"])
    num_workers = len(tf_config["cluster"]["worker"])
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    global_batch = PER_WORKER_BATCH * num_workers
    with strategy.scope():
        model = build_and_compile_model()
    meter = ThroughputMeter(global_batch)
    model.fit(dataset(global_batch), epochs=1, steps_per_epoch=args.steps, callbacks=[meter],
              verbose=0)
    if tf_config["task"]["index"] == 0:
        with open(args.out, "w") as f:
            json.dump({"images_per_sec": meter.images_per_sec,
                       "step_time_ms": meter.step_time_ms}, f)


if __name__ == "__main__":
    main()
