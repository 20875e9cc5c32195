"""Keras' SGD with momentum, its update in one pass over each variable.

Keras 3's ``SGD.update_step`` writes the new momentum and the new weights with four
element-wise operations, each a pass over the variable's memory with a temporary of its size.
For ``mlp``'s 9.4 MB of float32 weights on one core that is a third of a training step
(``bench.optimizer_step``: 4.0 ms, against 1.9 fused). TensorFlow's
``ResourceApplyKerasMomentum`` kernel computes the same two lines in one pass over the
variable, its momentum and the gradient::

    m = m * momentum - gradient * lr
    w = w + m                            (nesterov: w = w + m * momentum - gradient * lr)

with the same operations in the same order, so the weights are bit for bit Keras' own (in a
step that XLA compiles whole, XLA fuses each graph its own way: within float32 rounding).
:class:`SGD` takes that kernel for dense float32 gradients with momentum, and Keras' own update
otherwise (sparse gradients, no momentum, other dtypes). It is Keras' SGD in every other way:
the same variables, configuration and checkpoints, and a model saved with it reloads with
Keras' ``SGD`` (the class keeps Keras' name and module).
"""

from __future__ import annotations

from typing import Any

import keras

from tfscale.exchange.sharded_update import resource_handle


class SGD(keras.optimizers.SGD):
    """``keras.optimizers.SGD`` with the fused momentum update (see the module doc)."""

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        import tensorflow as tf

        if (self.momentum == 0 or isinstance(gradient, tf.IndexedSlices)
                or variable.dtype != tf.float32 or gradient.dtype != tf.float32):
            super().update_step(gradient, variable, learning_rate)
            return
        momentum = self.momentums[self._get_variable_index(variable)]
        # Under tf.distribute, inside the strategy's update of ``variable``: the momentum's
        # handle is that of the same device's copy.
        tf.raw_ops.ResourceApplyKerasMomentum(
            var=resource_handle(variable), accum=resource_handle(momentum),
            lr=tf.cast(learning_rate, tf.float32), grad=gradient,
            momentum=tf.cast(self.momentum, tf.float32), use_locking=False,
            use_nesterov=bool(self.nesterov))


# Keras' own update in one kernel: tfscale.exchange.sharded_update may shard it.
SGD.update_step.keras_momentum_update = True  # type: ignore[attr-defined]
SGD.__module__ = keras.optimizers.SGD.__module__
SGD.__qualname__ = keras.optimizers.SGD.__qualname__


def fuse(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
    """``optimizer`` with :class:`SGD`'s fused update if it is Keras' own ``SGD`` (or wraps one
    in a ``LossScaleOptimizer``): the same object, its class swapped (the same variables and
    weights). Subclasses of Keras' SGD and other optimizers are returned unchanged."""
    target = getattr(optimizer, "inner_optimizer", optimizer)
    if type(target) is keras.optimizers.SGD:
        target.__class__ = SGD
    return optimizer
