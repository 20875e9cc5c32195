"""Class-weighted loss on the climate-like synthetic data: does it find the rare classes?

Trains the tiny DeepLabV3+ and the tiny Tiramisu for the same steps, on the same samples in the
same order, from the same initial weights, once per weighting: none, and class weights computed
by :mod:`tfscale.training.class_weights` from a scan of the training labels (by default the
MLPerf DeepCAM form ``f ** -0.125`` and ``1 / sqrt(f)``). Each trained model is evaluated on a
fixed validation set: unweighted cross-entropy, IoU per class and the mean IoU of the rare
classes (every class but the background), computed here with NumPy from the predictions.

    TF_CPP_MIN_LOG_LEVEL=2 python -m bench.segmentation_class_weights  # docs/SEGMENTATION.md
    python -m bench.segmentation_class_weights --signal 1.0 --steps 100   # another setting

Writes ``bench/results/segmentation_class_weights.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import models
from bench.common import OUT, save, table
from input_pipelines.core.synthetic_fields import SIGNAL, samples, split_seed
from tfscale.config.train_config import TrainConfig
from tfscale.training.class_weights import weights_from_counts
from tfscale.training.losses import build_loss
from tfscale.training.metrics import build_metrics
from tfscale.training.optimizers import build_optimizer

MODELS = ("deeplabv3plus_tiny", "tiramisu_tiny")
WEIGHTINGS = ("none", "deepcam", "inverse_sqrt")


def _config(args: argparse.Namespace, model: str, weights: str = "") -> TrainConfig:
    return TrainConfig(
        model=model,
        dataset="synthetic_seg",
        image_size=args.image_size,
        input_channels=args.channels,
        num_classes=args.classes,
        batch_size=args.batch_size,
        steps=args.steps,
        optimizer="adamw",
        learning_rate=args.learning_rate,
        seed=args.seed,
        class_weights=weights,
    )


def _dataset(args: argparse.Namespace, split: str, count: int | None) -> tf.data.Dataset:
    base = split_seed(args.seed, 0, split)
    stream = samples(
        base,
        args.image_size,
        args.image_size,
        args.channels,
        args.classes,
        count,
        signal=args.signal,
    )
    if count is not None:
        stream = stream.cache()
    return stream.batch(args.batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def class_weights(args: argparse.Namespace, method: str) -> list[float] | None:
    """The tool's weights from ``args.scan`` training samples (None for no weighting)."""
    if method == "none":
        return None
    counts = np.zeros(args.classes, np.int64)
    for _, labels in _dataset(args, "train", args.scan).as_numpy_iterator():
        counts += np.bincount(labels.ravel(), minlength=args.classes)
    return weights_from_counts(counts.tolist(), method)


def evaluate(model: keras.Model, validation: tf.data.Dataset, classes: int) -> dict[str, Any]:
    """Unweighted cross-entropy and IoU per class over ``validation``, with NumPy."""
    confusion = np.zeros((classes, classes), np.int64)
    losses = []
    for images, labels in validation.as_numpy_iterator():
        logits = np.asarray(model(images, training=False), np.float64)
        shifted = logits - logits.max(-1, keepdims=True)
        log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
        losses.append(-np.take_along_axis(log_probs, labels[..., None], -1).mean())
        confusion += np.bincount(
            classes * labels.ravel() + logits.argmax(-1).ravel(), minlength=classes * classes
        ).reshape(classes, classes)
    hits = np.diag(confusion)
    union = confusion.sum(0) + confusion.sum(1) - hits
    iou = np.where(union > 0, hits / np.maximum(union, 1), np.nan)
    return {
        "val_loss": float(np.mean(losses)),
        "iou": [float(v) for v in iou],
        "rare_iou": float(np.nanmean(iou[1:])),
        "predicted_rare_fraction": float(confusion[:, 1:].sum() / confusion.sum()),
        "true_rare_fraction": float(confusion[1:].sum() / confusion.sum()),
    }


def run(args: argparse.Namespace, model_name: str, weights: list[float] | None) -> dict[str, Any]:
    """Trains one model for ``args.steps`` and evaluates it."""
    text = ",".join(repr(w) for w in weights) if weights else ""
    config = _config(args, model_name, text)
    keras.utils.set_random_seed(args.seed)
    model = models.MODELS.get(model_name)(config)
    model.compile(
        build_optimizer(config, 1, args.steps),
        build_loss(config, "segmentation"),
        metrics=build_metrics(config, "segmentation"),
    )
    start = time.perf_counter()
    history = model.fit(
        _dataset(args, "train", None), steps_per_epoch=args.steps, epochs=1, verbose=0
    )
    seconds = time.perf_counter() - start
    result = evaluate(model, _dataset(args, "validation", args.validation), args.classes)
    return {
        "model": model_name,
        "train_loss": float(history.history["loss"][-1]),
        "train_seconds": seconds,
        **result,
    }


def markdown(data: dict[str, Any]) -> str:
    """The results as Markdown: the setting, then one row per model and weighting."""
    setup = data["setup"]
    rows = []
    for r in data["rows"]:
        row = {k: r[k] for k in ("model", "weighting", "train_loss", "val_loss", "rare_iou")}
        row.update({f"iou_{c}": v for c, v in enumerate(r["iou"])})
        row["rare pixels predicted / true"] = (
            f"{r['predicted_rare_fraction']:.4f} / {r['true_rare_fraction']:.4f}"
        )
        rows.append(row)
    columns = [
        "model",
        "weighting",
        "train_loss",
        "val_loss",
        *[f"iou_{c}" for c in range(setup["classes"])],
        "rare_iou",
        "rare pixels predicted / true",
    ]
    weights = "\n".join(f"- {m}: {[round(w, 4) for w in ws]}" for m, ws in data["weights"].items())
    return (
        f"{table(rows, columns)}\n\nClass weights (from {setup['scan']} training samples):\n"
        f"{weights}\n\nSetting: {setup}\n"
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench.segmentation_class_weights", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument(
        "--weightings",
        default=",".join(WEIGHTINGS),
        help="none and/or methods of tfscale.training.class_weights",
    )
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch_size", type=int, default=8)
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--channels", type=int, default=16)
    parser.add_argument("--classes", type=int, default=3)
    parser.add_argument(
        "--signal",
        type=float,
        default=None,
        help="class signature strength (default: the synthetic_seg pipeline's)",
    )
    parser.add_argument("--learning_rate", type=float, default=0.003)
    parser.add_argument("--validation", type=int, default=128, help="validation samples")
    parser.add_argument("--scan", type=int, default=256, help="samples scanned for weights")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--name", default="segmentation_class_weights")
    args = parser.parse_args(argv)
    args.signal = SIGNAL if args.signal is None else args.signal
    weightings = args.weightings.split(",")
    weights = {m: class_weights(args, m) for m in weightings}
    rows = []
    for model_name in args.models.split(","):
        for method in weightings:
            row = {**run(args, model_name, weights[method]), "weighting": method}
            print(
                f"{model_name:<20} {method:<13} rare IoU {row['rare_iou']:.4f}  IoU "
                f"{np.round(row['iou'], 4).tolist()}  ({row['train_seconds']:.0f} s)",
                flush=True,
            )
            rows.append(row)
    data = {
        "rows": rows,
        "weights": {m: w for m, w in weights.items() if w},
        "setup": {k: v for k, v in vars(args).items() if k != "name"},
    }
    path = save(args.name, data)
    text = markdown(data)
    (OUT / f"{args.name}.md").write_text(text)
    print(f"\n{text}\nwrote {path} and {OUT / (args.name + '.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
