"""Exact evaluation on the validation split, across any number of workers.

Each worker runs the model in inference mode over ONE pass of its own validation batches (the
last one partial, see :mod:`input_pipelines.registry`), or at most ``--validation_steps``
batches, and adds up, in float64 on the host:

    [loss sum, loss terms, examples, top-1 correct, top-5 correct, confusion matrix K x K]

(loss terms are examples for classification and pixels for segmentation; the confusion matrix,
rows = labels and columns = predictions, only for segmentation). One all-reduce (``sum``) of
that vector through the strategy makes the totals of the whole job, from which every metric is
derived, so uneven shards count each example exactly once, and a worker without validation
examples still takes part (it adds zeros).

The reported metrics (see :func:`tfscale.config.targets.reported_metrics`) are ``val_loss`` (the
compiled loss of :func:`tfscale.training.losses.build_loss`, class weights and label smoothing
included,
averaged over every term of the split), ``val_accuracy`` (top-1, or per pixel),
``val_top5_accuracy`` (classification with at least 6 classes), and for segmentation
``val_iou_<c>`` (0 for a class absent from labels and predictions) and ``val_mean_iou`` (the
mean over the classes present in labels or predictions), as :mod:`tfscale.training.metrics` defines
them for training.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any, Protocol

import keras
import numpy as np
import tensorflow as tf

from tfscale.config.targets import TOP5_MIN_CLASSES
from tfscale.config.tasks import CLASSIFICATION, SEGMENTATION

HEAD = 5  # loss sum, loss terms, examples, top-1 correct, top-5 correct


class SumReducer(Protocol):
    """What evaluation needs from a strategy: a host all-reduce (every strategy has one)."""

    def all_reduce(self, values: Sequence[float] | np.ndarray, op: str = "mean") -> np.ndarray: ...


def sums_size(task: str, num_classes: int) -> int:
    """Length of the vector of sums for ``task``."""
    return HEAD + (num_classes * num_classes if task == SEGMENTATION else 0)


def batch_sums(logits: tf.Tensor, labels: tf.Tensor, loss_terms: tf.Tensor, task: str,
               num_classes: int) -> tf.Tensor:
    """The float64 vector of sums of one batch (see the module docstring).

    Args:
        logits: ``[B, K]`` or ``[B, H, W, K]``.
        labels: ``[B]`` or ``[B, H, W]`` integer labels.
        loss_terms: the loss of each example or pixel, shaped like ``labels``.
        task: ``classification`` or ``segmentation``.
        num_classes: K.
    """
    logits = tf.cast(logits, tf.float32)
    labels = tf.cast(labels, tf.int32)
    examples = tf.cast(tf.shape(labels)[0], tf.float64)
    terms = tf.cast(tf.size(loss_terms), tf.float64)
    loss_sum = tf.reduce_sum(tf.cast(loss_terms, tf.float64))
    flat_labels = tf.reshape(labels, [-1])
    flat_logits = tf.reshape(logits, [-1, num_classes])
    predicted = tf.argmax(flat_logits, axis=-1, output_type=tf.int32)
    correct = tf.reduce_sum(tf.cast(tf.equal(predicted, flat_labels), tf.float64))
    if task == CLASSIFICATION and num_classes >= TOP5_MIN_CLASSES:
        top5 = tf.reduce_sum(tf.cast(tf.math.in_top_k(flat_labels, flat_logits, 5), tf.float64))
    else:
        top5 = tf.constant(0.0, tf.float64)
    head = tf.stack([loss_sum, terms, examples, correct, top5])
    if task != SEGMENTATION:
        return head
    confusion = tf.math.confusion_matrix(flat_labels, predicted, num_classes, dtype=tf.float64)
    return tf.concat([head, tf.reshape(confusion, [-1])], axis=0)


def derive(totals: np.ndarray, task: str, num_classes: int) -> dict[str, float]:
    """The ``val_`` metrics of a job-wide vector of sums (NaN when it holds no example)."""
    loss_sum, terms, examples, correct, top5 = (float(v) for v in totals[:HEAD])
    with np.errstate(invalid="ignore", divide="ignore"):
        metrics = {"val_loss": loss_sum / terms if terms else float("nan"),
                   "val_accuracy": correct / terms if terms else float("nan")}
        if task == CLASSIFICATION and num_classes >= TOP5_MIN_CLASSES:
            metrics["val_top5_accuracy"] = top5 / examples if examples else float("nan")
        if task == SEGMENTATION:
            metrics.update(iou_metrics(totals[HEAD:].reshape(num_classes, num_classes)))
    return metrics


def iou_metrics(confusion: np.ndarray) -> dict[str, float]:
    """``val_iou_<c>`` and ``val_mean_iou`` of a confusion matrix (rows: labels)."""
    hits = np.diag(confusion)
    union = confusion.sum(axis=0) + confusion.sum(axis=1) - hits
    present = union > 0
    iou = np.where(present, hits / np.where(present, union, 1.0), 0.0)
    out = {f"val_iou_{c}": float(v) for c, v in enumerate(iou)}
    out["val_mean_iou"] = float(iou[present].mean()) if present.any() else float("nan")
    return out


class Evaluator:
    """Evaluates a model on this worker's validation batches and reduces across workers.

    Every worker must call :meth:`evaluate` at the same points (it is a collective).

    Args:
        dataset: this worker's validation batches (finite, or capped by ``max_batches``).
        max_batches: at most this many batches per evaluation (0 = the whole dataset).
        loss: the compiled loss (its ``call`` gives the loss of each example or pixel).
        task: ``classification`` or ``segmentation``.
        num_classes: K.
        comm: the strategy (or any object with a host ``all_reduce``).
    """

    def __init__(self, dataset: tf.data.Dataset, max_batches: int, loss: keras.losses.Loss,
                 task: str, num_classes: int, comm: SumReducer) -> None:
        self.dataset = dataset.take(max_batches) if max_batches else dataset
        self.loss = loss
        self.task = task
        self.num_classes = num_classes
        self.comm = comm
        self._step: Any = None
        self._model: keras.Model | None = None

    def _step_of(self, model: keras.Model) -> Any:
        if self._model is not model:
            def step(images: tf.Tensor, labels: tf.Tensor) -> tf.Tensor:
                logits = model(images, training=False)
                terms = self.loss.call(labels, tf.cast(logits, tf.float32))
                return batch_sums(logits, labels, terms, self.task, self.num_classes)

            # A partial last batch has another shape; one relaxed trace serves both.
            self._step = tf.function(step, reduce_retracing=True)
            self._model = model
        return self._step

    def local_sums(self, model: keras.Model) -> np.ndarray:
        """This worker's vector of sums over its validation batches."""
        step = self._step_of(model)
        sums = np.zeros(sums_size(self.task, self.num_classes), np.float64)
        for images, labels in self.dataset:
            sums += step(images, labels).numpy()
        return sums

    def evaluate(self, model: keras.Model) -> tuple[dict[str, float], int]:
        """The job-wide metrics and the number of examples they cover."""
        totals = np.asarray(self.comm.all_reduce(self.local_sums(model), "sum"), np.float64)
        return derive(totals, self.task, self.num_classes), int(round(totals[2]))


class EvaluationSummaries:
    """An evaluation listener that writes each record's metrics as TensorBoard scalars at the
    record's step, under ``directory`` (create it on the chief only)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.directory = str(directory)
        self._writer: Any = None

    def __call__(self, record: dict[str, Any]) -> None:
        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.directory)
        with self._writer.as_default(step=record["step"]):
            for name, value in record["metrics"].items():
                tf.summary.scalar(name, value)
            tf.summary.scalar("examples", record["examples"])
        self._writer.flush()
