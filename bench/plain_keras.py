"""The baseline a user would write without tfscale: one process, plain ``model.fit`` on the same
ResNet-50, batch, optimizer and synthetic data. Prints one JSON line with its throughput.

    python -m bench.plain_keras --batch_size 32 --steps 6 [--jit] [--threads 1] [--step_lines]

``--step_lines`` prints ``step i/N`` at each batch end, as ``tfscale.train --log_every=1``
does, so that a reader of its output can time each step (``bench.overhead --side_by_side``).
"""

from __future__ import annotations

import argparse
import json
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from models.resnet50 import resnet50  # noqa: E402
from tfscale.callbacks import ThroughputMeter  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--jit", action="store_true")
    parser.add_argument("--threads", type=int, default=0,
                        help="TensorFlow's intra- and inter-op threads (0: its defaults)")
    parser.add_argument("--step_lines", action="store_true",
                        help="print 'step i/N' at each batch end")
    args = parser.parse_args()
    if args.threads:
        tf.config.threading.set_intra_op_parallelism_threads(args.threads)
        tf.config.threading.set_inter_op_parallelism_threads(args.threads)
    images = tf.random.uniform((4, args.batch_size, args.image_size, args.image_size, 3))
    labels = tf.random.uniform((4, args.batch_size), maxval=1000, dtype=tf.int32)
    data = tf.data.Dataset.from_tensor_slices((images, labels)).repeat()
    model = resnet50((args.image_size, args.image_size, 3), 1000)
    model.compile(optimizer=keras.optimizers.SGD(0.01, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=args.jit)
    meter = ThroughputMeter(args.batch_size)  # the same instrument tfscale reports with
    callbacks: list[keras.callbacks.Callback] = [meter]
    if args.step_lines:
        callbacks.append(keras.callbacks.LambdaCallback(
            on_train_batch_end=lambda batch, logs: print(f"step {batch + 1}/{args.steps}",
                                                         flush=True)))
    model.fit(data, steps_per_epoch=args.steps, epochs=1, callbacks=callbacks, verbose=0)
    print(json.dumps({"images_per_sec": meter.images_per_sec,
                      "step_time_ms": meter.step_time_ms, "steps": meter.steps}))


if __name__ == "__main__":
    main()
