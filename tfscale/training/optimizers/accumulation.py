"""Gradient accumulation: K micro-batches per optimizer step, in one training step.

Each training step of a model given :func:`accumulate_gradients` takes a batch of K x B examples
per replica, runs the forward and backward pass on its K micro-batches of B one after the
other, and applies the mean of their gradients once. So one Keras step is one optimizer step:
``optimizer.iterations``, learning-rate schedules, ``steps_per_epoch``, callbacks and
checkpoints all count optimizer steps, and the gradient exchange that a strategy puts in the
optimizer (tf.distribute's all-reduce, Horovod's grouped all-reduce, DDL's hierarchical one)
runs once per K micro-batches, outside any control flow.

Why not Keras's ``gradient_accumulation_steps`` or Horovod's ``backward_passes_per_step``: both
keep one Keras step per micro-batch, so the step counter and the learning-rate schedule see
micro-batches (Keras feeds the schedule its raw counter), and both put the update behind a
``cond``; in Keras's, tf.distribute's all-reduce runs inside that ``cond``, where
MirroredStrategy cannot synchronise replicas.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import keras


def accumulate_gradients(model: keras.Model, micro_batches: int) -> None:
    """Makes every training step of the compiled ``model`` average the gradients of
    ``micro_batches`` micro-batches before one optimizer update.

    The step's batch (per replica) must be divisible by ``micro_batches``; micro-batch ``i`` is
    its ``i``-th contiguous slice. The micro-batches run in sequence (each waits for the
    previous one's gradients), so activations are held for one micro-batch at a time. The loss
    and metrics are those of all the step's examples. Batch normalisation sees micro-batches.

    Raises:
        ValueError: for ``micro_batches`` < 1.
    """
    if micro_batches < 1:
        raise ValueError(f"micro_batches={micro_batches}; must be >= 1")
    if micro_batches == 1:
        return

    def train_step(data: Any) -> Any:
        return _accumulating_train_step(model, data, micro_batches)

    # Keras looks the step up on the model when it builds the training function.
    model.train_step = train_step


def _split(data: Any, parts: int) -> list[Any]:
    """``data`` (a nest of batched tensors) as ``parts`` nests of consecutive slices."""
    import tensorflow as tf

    leaves = tf.nest.flatten(data)
    pieces = [[None] * parts if t is None else tf.split(t, parts, axis=0) for t in leaves]
    return [tf.nest.pack_sequence_as(data, [p[i] for p in pieces]) for i in range(parts)]


def _accumulating_train_step(model: keras.Model, data: Any, micro_batches: int) -> Any:
    """Keras's TensorFlow ``train_step`` (keras/src/backend/tensorflow/trainer.py), looped over
    micro-batches with one ``apply_gradients`` at the end. It uses the same private members
    (``_compute_loss``, ``_loss_tracker``) as the step it replaces, so the logged loss and
    metrics mean the same."""
    import keras
    import tensorflow as tf
    from keras.src.losses.loss import unscale_loss_for_distribution

    weights = model.trainable_weights
    total: list[Any] = [None] * len(weights)
    metrics: Any = {}
    for micro in _split(data, micro_batches):
        # Waiting for the previous micro-batch's gradients keeps one micro-batch's activations
        # alive at a time; without it the executor may run the forward passes side by side.
        with tf.control_dependencies([g for g in total if g is not None]):
            micro = tf.nest.map_structure(
                lambda t: None if t is None else tf.identity(t), micro)
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(micro)
        with tf.GradientTape() as tape:
            y_pred = model(x, training=True) if model._call_has_training_arg else model(x)
            loss = model._compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight,
                                       training=True)
            examples = tf.shape(next(t for t in tf.nest.flatten(x) if t is not None))[0]
            model._loss_tracker.update_state(unscale_loss_for_distribution(loss),
                                             sample_weight=examples)
            loss = model.optimizer.scale_loss(loss)
        grads = tape.gradient(loss, weights)
        total = [g if t is None else t if g is None else t + g
                 for t, g in zip(total, grads, strict=True)]
        metrics = model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
    mean = [None if g is None else g / micro_batches for g in total]
    model.optimizer.apply_gradients(zip(mean, weights, strict=True))
    return metrics
