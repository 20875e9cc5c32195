"""A user's own Horovod-style script (as Horovod's ``tensorflow2_keras_mnist`` example is
written) on ``tfscale.horovod``: the ``mlp`` of bench/scaling.py on synthetic images, batch 64
per worker. bench/user_scripts.py starts it on local workers; rank 0 writes its images/s as
JSON to ``--out``.

    python -m bench.user_scripts
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tfscale.horovod as hvd  # noqa: E402
from tfscale.callbacks import ThroughputMeter  # noqa: E402

BATCH, SIZE, CLASSES = 64, 32, 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=200)
    args = parser.parse_args()

    hvd.init()
    rng = np.random.default_rng(hvd.rank())
    images = rng.uniform(size=(4 * BATCH, SIZE, SIZE, 3)).astype("float32")
    labels = rng.integers(0, CLASSES, 4 * BATCH)
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).batch(BATCH).cache().repeat()

    model = keras.Sequential([
        keras.Input((SIZE, SIZE, 3)),
        keras.layers.Flatten(),
        keras.layers.Dense(512, activation="relu"),
        keras.layers.Dense(512, activation="relu"),
        keras.layers.Dense(CLASSES),
    ])
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(0.01 * hvd.size(), momentum=0.9))
    model.compile(loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  optimizer=opt, metrics=["accuracy"])
    meter = ThroughputMeter(BATCH * hvd.size())
    callbacks = [hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                 hvd.callbacks.MetricAverageCallback(), meter]
    model.fit(dataset, steps_per_epoch=args.steps, epochs=1, callbacks=callbacks,
              verbose=0)
    if hvd.rank() == 0:
        with open(args.out, "w") as f:
            json.dump({"images_per_sec": meter.images_per_sec,
                       "step_time_ms": meter.step_time_ms}, f)


if __name__ == "__main__":
    main()
