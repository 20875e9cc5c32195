"""The baseline for ``bench.accuracy``: what a user writes without tfscale. One process, the same
model (``resnet50_tiny``'s builder), the same TFRecord split, pixels / 255, no augmentation, SGD
with momentum and Keras' own cosine decay with linear warmup, ``model.fit`` with validation data.
Prints one JSON line: per-epoch validation accuracy and wall-clock seconds since training began.

    python -m bench.accuracy_keras --data_dir /tmp/digits/tfrecord --epochs 10 --batch_size 64
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import time
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from models.resnet50 import resnet50  # noqa: E402

FEATURES = {"image/encoded": tf.io.FixedLenFeature([], tf.string),
            "image/class/label": tf.io.FixedLenFeature([], tf.int64)}


def load(data_dir: str, split: str, size: int) -> tuple[np.ndarray, np.ndarray]:
    """Every image of ``split`` as float32 ``[N, size, size, 3]`` in [0, 1], and the labels."""
    files = sorted(glob.glob(os.path.join(data_dir, f"{split}-*")))

    def decode(record: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        example = tf.io.parse_single_example(record, FEATURES)
        image = tf.io.decode_image(example["image/encoded"], channels=3,
                                   expand_animations=False)
        image = tf.image.resize(tf.cast(image, tf.float32), [size, size]) / 255.0
        return image, example["image/class/label"]

    images, labels = zip(*tf.data.TFRecordDataset(files).map(decode).as_numpy_iterator(),
                         strict=True)
    return np.stack(images), np.asarray(labels)


class EpochClock(keras.callbacks.Callback):
    """Records (epoch, seconds since training began, val_accuracy) after every epoch."""

    def __init__(self) -> None:
        super().__init__()
        self.start = 0.0
        self.rows: list[dict[str, Any]] = []

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.rows.append({"epoch": epoch + 1, "seconds": time.perf_counter() - self.start,
                          "val_accuracy": float((logs or {})["val_accuracy"]),
                          "accuracy": float((logs or {})["accuracy"])})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--learning_rate", type=float, default=0.05)
    parser.add_argument("--warmup_epochs", type=float, default=1.0)
    parser.add_argument("--warmup_steps", type=int, default=None,
                        help="linear warmup in steps (overrides --warmup_epochs)")
    parser.add_argument("--num_classes", type=int, default=10)
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    keras.utils.set_random_seed(args.seed)
    x_train, y_train = load(args.data_dir, "train", args.image_size)
    x_val, y_val = load(args.data_dir, "validation", args.image_size)
    steps_per_epoch = len(x_train) // args.batch_size
    total = steps_per_epoch * args.epochs
    warmup = (args.warmup_steps if args.warmup_steps is not None
              else int(args.warmup_epochs * steps_per_epoch))
    schedule = keras.optimizers.schedules.CosineDecay(
        0.0, total - warmup, warmup_target=args.learning_rate, warmup_steps=warmup)
    model = resnet50((args.image_size, args.image_size, 3), args.num_classes, width=1 / 16)
    model.compile(optimizer=keras.optimizers.SGD(schedule, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    clock = EpochClock()
    model.fit(x_train, y_train, batch_size=args.batch_size, epochs=args.epochs,
              validation_data=(x_val, y_val), callbacks=[clock], verbose=0)
    print(json.dumps({"train_examples": len(x_train), "validation_examples": len(x_val),
                      "epochs": clock.rows}))


if __name__ == "__main__":
    main()
