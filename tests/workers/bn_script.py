"""A user's own Keras script with batch norm, for tests/test_bn_statistics.py: the batch-norm
statistics of the trained model through ``tfscale.prepare(bn_statistics_data=...)`` (``--api
prepare``, any tfscale strategy) or the ``tfscale.callbacks.BatchNormStatistics`` callback in a
plain ``MultiWorkerMirroredStrategy`` script (``--api keras``).

Each worker trains 3 steps of 4 on its shard of a fixed stream of images with validation data
(``fit`` evaluates each epoch, which recomputes the statistics first), then writes its weights
(moving statistics included, in ``model.get_weights()`` order) and the first batches of its
shard, those the statistics are computed over, to ``OUT/rank<R>.npz``.

    tfscale-run --nproc=2 --strategy=horovod tests/workers/bn_script.py --out DIR
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

SHAPE, BATCH, IMAGES = (6, 6, 3), 4, 16


def build_model() -> keras.Model:
    keras.utils.set_random_seed(3)
    inputs = keras.Input(SHAPE)
    x = inputs
    for block in ("b1", "b2"):
        x = keras.layers.Conv2D(4, 3, padding="same", name=f"{block}_conv")(x)
        x = keras.layers.BatchNormalization(name=f"{block}_bn")(x)
        x = keras.layers.ReLU(name=f"{block}_relu")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(x))


def examples() -> tf.data.Dataset:
    rng = np.random.default_rng(7)
    x = (rng.random((64, *SHAPE)) * np.linspace(1, 4, 64)[:, None, None, None]).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, rng.integers(0, 3, 64).astype("int32")))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--api", choices=("prepare", "keras"), default="prepare")
    args = parser.parse_args()
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    if args.api == "prepare":
        import tfscale

        strategy = tfscale.setup()
        rank, size = strategy.rank, strategy.size
        train = tfscale.shard_dataset(examples(), batch_size=BATCH)
        model, optimizer, callbacks = tfscale.prepare(
            build_model(), keras.optimizers.SGD(0.1), bn_statistics_data=train,
            bn_statistics_images=IMAGES)
        model.compile(optimizer=optimizer, loss=loss)
        own = train
    else:
        import json

        import tfscale.multiworker
        from tfscale.callbacks import BatchNormStatistics

        tfscale.multiworker.enable()
        mwms = tf.distribute.MultiWorkerMirroredStrategy()
        task = json.loads(os.environ["TF_CONFIG"])["task"]
        rank, size = int(task["index"]), mwms.num_replicas_in_sync
        own = examples().shard(size, rank).batch(BATCH, drop_remainder=True)
        train = tfscale.multiworker.per_worker_dataset(own)
        with mwms.scope():
            model = build_model()
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss=loss)
        callbacks = [BatchNormStatistics(own, images=IMAGES)]
    validation = examples().take(8).batch(8)
    model.fit(train, validation_data=validation, epochs=1, steps_per_epoch=3,
              callbacks=callbacks, verbose=0)
    used = [np.asarray(x) for x, _ in own.take(IMAGES // (BATCH * size))]
    out = Path(args.out)
    np.savez(out / f"rank{rank}.npz", images=np.concatenate(used),
             **{f"w{i}": np.asarray(w) for i, w in enumerate(model.get_weights())})


if __name__ == "__main__":
    main()
