"""A user's own Keras script on ``tfscale.prepare``, for the test that compares it with
``tfscale.train`` (tests/test_prepare.py).

It builds tfscale.train's ``tiny_cnn`` from the model code (as a user builds their own),
reads the same data as ``tfscale.train --dataset=synthetic`` (worker ``r``'s batches come from
seed ``r``), but as one stream of examples that :func:`tfscale.shard_dataset` shards and
batches, and trains with gradient accumulation and (Horovod-style strategies) the gradient
lag. Each worker writes its weights and losses to
``OUT/rank<R>.npz`` / ``.json``; the chief checkpoints into ``OUT/checkpoints``.

    tfscale-run --nproc=2 --strategy=horovod tests/workers/prepare_script.py --out DIR
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

import tfscale  # noqa: E402
from models.small import tiny_cnn  # noqa: E402

SIZE, CHANNELS, CLASSES, BATCHES = 16, 3, 4, 4


def global_examples(workers: int, batch: int) -> tf.data.Dataset:
    """Every worker's examples in one stream, repeated, in which worker ``r``'s are every
    ``workers``-th from ``r`` on, in the order of tfscale.train's synthetic batches of seed
    ``r``."""
    images, labels = [], []
    for seed in range(workers):
        images.append(tf.random.stateless_uniform([BATCHES, batch, SIZE, SIZE, CHANNELS],
                                                  seed=[seed, 0]))
        labels.append(tf.random.stateless_uniform([BATCHES, batch], seed=[seed, 1],
                                                  maxval=CLASSES, dtype=tf.int32))
    # [batch index, example, worker, ...] flattened: worker r's example j of batch i is
    # element (i * batch + j) * workers + r.
    x = tf.reshape(tf.stack(images, axis=2), [-1, SIZE, SIZE, CHANNELS])
    y = tf.reshape(tf.stack(labels, axis=2), [-1])
    return tf.data.Dataset.from_tensor_slices((x, y)).repeat()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--grad_accum_steps", type=int, default=2)
    parser.add_argument("--gradient_lag", type=int, default=1)
    args = parser.parse_args()

    strategy = tfscale.setup()
    keras.utils.set_random_seed(0)
    model = tiny_cnn((SIZE, SIZE, CHANNELS), CLASSES)
    model, optimizer, callbacks = tfscale.prepare(
        model, keras.optimizers.SGD(0.1, momentum=0.9), grad_accum_steps=args.grad_accum_steps,
        gradient_lag=args.gradient_lag,
        checkpoint_dir=os.path.join(args.out, "checkpoints"))
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    batch = args.batch * args.grad_accum_steps
    data = tfscale.shard_dataset(global_examples(strategy.size, batch), batch_size=batch)
    history = model.fit(data, epochs=1,
                        steps_per_epoch=args.steps, callbacks=callbacks, verbose=0)
    out = Path(args.out)
    np.savez(out / f"rank{strategy.rank}.npz", *[np.asarray(w) for w in model.get_weights()])
    (out / f"rank{strategy.rank}.json").write_text(json.dumps(
        {"loss": history.history["loss"], "size": strategy.size}))


if __name__ == "__main__":
    main()
