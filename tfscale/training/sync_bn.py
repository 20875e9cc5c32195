"""Synchronized batch normalization: batch statistics over the replicas of a group.

In training, an ordinary batch-norm layer normalizes with the mean and variance of its own
replica's batch. Synchronized, it uses those of the batches of all replicas (or of each group of
``G`` consecutive replicas, as the MLPerf DeepCAM reference does), so a job of N replicas x B
examples normalizes, and so trains, as one replica of N x B would. That matters when B is small
(segmentation, large models).

The layers stay ordinary ``keras.layers.BatchNormalization``: each layer instance computes its
moments with a collective instead of locally (one sum over the group per layer and step, of
the local sums of x and x**2 and the count, concatenated), and everything else is unchanged.
So checkpoints are the same as without synchronization, inference uses the moving statistics
as usual, and a model saved from its config (``tfscale.training.trainer.save_model``) or by Keras
loads with plain Keras. The statistics are computed in float32 under mixed precision (Keras
upcasts the layer's inputs first).

In your own script, after building (and compiling) the model, give it an in-graph,
differentiable sum over the replicas of a group::

    import horovod.tensorflow as hvd
    from tfscale.training.sync_bn import synchronize_batch_norm

    synchronize_batch_norm(model, lambda t: hvd.allreduce(t, op=hvd.Sum))

or, with a tfscale strategy (any of them; groups of 2 replicas)::

    synchronize_batch_norm(model, lambda t: strategy.replica_sum(t, group_size=2))

Under a plain ``tf.distribute`` strategy, Keras's own
``BatchNormalization(synchronized=True)`` does the same over all replicas, but its first step
traces far slower under ``MirroredStrategy`` (see ``TFDistributeStrategy.replica_sum``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tfscale.cluster import rank_zero
from tfscale.strategies.base import replica_groups
from tfscale.training.bn_statistics import batch_norm_layers

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from tfscale.config.train_config import TrainConfig
    from tfscale.strategies.base import Strategy

GroupSum = Callable[["tf.Tensor"], "tf.Tensor"]


def synchronize_batch_norm(model: keras.Layer, group_sum: GroupSum) -> int:
    """Makes every batch-norm layer of ``model`` compute its training statistics over the
    replicas that ``group_sum`` adds up.

    Args:
        model: a built or unbuilt Keras model (or layer); nested models are included.
        group_sum: called inside the training step with one float tensor per layer and call;
            returns its sum over the replicas of this replica's group, on every replica of
            the group, and must be differentiable (its gradient: the sum of the upstream
            gradients over the same replicas).

    Returns:
        The number of batch-norm layers synchronized.

    Raises:
        ValueError: when ``model`` has no batch-norm layer.
    """
    layers = batch_norm_layers(model)
    if not layers:
        raise ValueError(f"model {model.name!r} has no BatchNormalization layer to synchronize")
    for layer in layers:
        layer._moments = _group_moments(layer, group_sum)
    return len(layers)


def synchronize_under_strategy(model: keras.Model, strategy: Strategy,
                               config: TrainConfig) -> int:
    """``--sync_bn``: synchronizes ``model``'s batch norm over ``strategy``'s replicas in groups
    of ``--sync_bn_group``, and says so on the chief.

    Returns:
        The number of batch-norm layers synchronized.

    Raises:
        ValueError: when the group size does not divide the replicas, the model has no batch
            norm, or ``--xla=jit`` would compile the strategy's collectives into XLA.
    """
    groups = replica_groups(config.sync_bn_group, strategy.num_replicas)
    if strategy.jit_compiles == "model":
        raise ValueError(
            f"--sync_bn does not combine with --xla=jit under --strategy={config.strategy} "
            f"here ({strategy.num_replicas} replica(s)): the batch-norm statistics are summed "
            "inside the model's forward pass, which --xla=jit compiles, and the sum cannot run "
            "inside XLA (Horovod's ops; TensorFlow's collectives on CPUs); use --xla=auto or "
            "--xla=off")
    try:
        count = synchronize_batch_norm(
            model, lambda t: strategy.replica_sum(t, config.sync_bn_group))
    except ValueError:
        raise ValueError(f"--sync_bn: --model={config.model} has no batch-norm layers to "
                         "synchronize; drop --sync_bn or pick a model with batch norm") from None
    replicas = strategy.num_replicas // groups
    over = (f"groups of {replicas} replica(s) ({groups} groups)" if groups > 1
            else f"all {replicas} replica(s)")
    rank_zero.log(f"--sync_bn: {count} batch-norm layers compute their statistics over {over}")
    return count


def _group_moments(layer: keras.layers.BatchNormalization, group_sum: GroupSum
                   ) -> Callable[[tf.Tensor, tf.Tensor | None], tuple[tf.Tensor, tf.Tensor]]:
    """A replacement for ``layer._moments(inputs, mask)`` (Keras 3.15's
    ``BatchNormalization``): mean and variance over the reduction axes and the group's
    replicas, as E[x] and E[x**2] - E[x]**2 from one sum of the local sums and count."""

    def moments(inputs: tf.Tensor, mask: tf.Tensor | None) -> tuple[tf.Tensor, tf.Tensor]:
        import tensorflow as tf

        axes = layer._reduction_axes
        dtype = inputs.dtype if inputs.dtype in (tf.float32, tf.float64) else tf.float32
        x = tf.cast(inputs, dtype)
        if mask is None:
            total = tf.reduce_sum(x, axes)
            squares = tf.reduce_sum(tf.square(x), axes)
            count = tf.cast(tf.size(x) // tf.size(total), dtype)[tf.newaxis]
        else:
            # As Keras's own masked moments: the mask has no channel axis, masked-out
            # positions weigh nothing.
            weights = tf.broadcast_to(tf.cast(mask, dtype)[..., tf.newaxis], tf.shape(x))
            total = tf.reduce_sum(x * weights, axes)
            squares = tf.reduce_sum(tf.square(x) * weights, axes)
            count = tf.reduce_sum(weights, axes)
        channels = int(total.shape[0])
        summed = group_sum(tf.concat([total, squares, count], axis=0))
        total, squares, count = tf.split(summed, [channels, channels, -1])
        mean = tf.math.divide_no_nan(total, count)
        variance = tf.maximum(tf.math.divide_no_nan(squares, count) - tf.square(mean), 0.0)
        return tf.cast(mean, inputs.dtype), tf.cast(variance, inputs.dtype)

    return moments
