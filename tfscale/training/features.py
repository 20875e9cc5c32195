"""What ``tfscale.prepare`` and ``tfscale.train`` do to a model and its optimizer, in one order.

Both call :func:`apply` (``tfscale.train`` through its trainer), so the features are applied
in the order owned here:

1. the precision policy (set by ``tfscale.setup``; checked against the model's);
2. a ``LossScaleOptimizer`` under ``mixed_float16``;
3. the strategy's gradient exchange (``strategy.wrap_optimizer``, gradient lag included);
4. ``optimizer.build`` (the optimizer's variables, in the strategy's scope);
5. gradient accumulation, 6. recomputation, 7. synchronized batch norm;
8. the strategy's last changes to the model (``strategy.prepare_model``: XLA of the passes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tfscale.cluster import rank_zero
from tfscale.training.runtime import POLICIES

if TYPE_CHECKING:
    import keras

    from tfscale.config.train_config import TrainConfig
    from tfscale.strategies.base import Strategy
    from tfscale.training.recompute import BlockRule


def apply(model: keras.Model, optimizer: Any, config: TrainConfig, strategy: Strategy,
          recompute: BlockRule | None) -> keras.optimizers.Optimizer:
    """Applies ``config``'s features to ``model`` and ``optimizer`` (a Keras optimizer, its
    name, or None for a compiled model's own) under ``strategy``, in the module's order, and
    returns the optimizer to compile with.

    Raises:
        ValueError: one line (``tfscale.prepare: ...``), for a feature the strategy or model
            cannot run, a model built under another precision or outside the strategy's
            scope, or an unbuilt model.
    """
    import keras

    from tfscale.training.optimizers.sgd import fuse

    _check_model(model, config, strategy)
    # Strategies read their features (gradient_lag) from their config.
    strategy.config = strategy.settings(config)
    with strategy.scope():
        if optimizer is None:
            if not model.compiled:
                raise ValueError("tfscale.prepare: give an optimizer, or compile the model first")
            optimizer = model.optimizer
        # Keras' SGD takes the fused update: the same weights, half the update's time.
        prepared: keras.optimizers.Optimizer = fuse(keras.optimizers.get(optimizer))
        if (config.precision == "mixed_float16"
                and not isinstance(prepared, keras.optimizers.LossScaleOptimizer)):
            prepared = keras.optimizers.LossScaleOptimizer(prepared)
        prepared = strategy.wrap_optimizer(prepared)
        if model.compiled:
            model.optimizer = prepared
        prepared.build(model.trainable_variables)
        _apply_model_features(model, config, strategy, recompute)
    strategy.prepare_model(model)
    return prepared


def _check_model(model: keras.Model, config: TrainConfig, strategy: Strategy) -> None:
    """Refuses a model that ``prepare`` cannot make right any more: unbuilt, built under
    another dtype policy, or outside the strategy's scope."""
    if not model.built or not model.trainable_variables:
        raise ValueError(f"tfscale.prepare: model {model.name!r} has no variables yet; build it "
                         "first (keras.Input, model.build(shape) or one call on a batch)")
    expected = POLICIES[config.precision]
    if model.dtype_policy.name != expected:
        raise ValueError(
            f"tfscale.prepare: model {model.name!r} was built with dtype policy "
            f"{model.dtype_policy.name!r}, precision {config.precision!r} needs {expected!r}: "
            f"call tfscale.setup(precision={config.precision!r}) before building the model")
    expected_scope = getattr(strategy, "tf_strategy", None)
    built_under = getattr(model, "_distribute_strategy", None)
    if expected_scope is not None and built_under is not expected_scope and (
            built_under is not None or expected_scope.num_replicas_in_sync > 1):
        raise ValueError(f"tfscale.prepare: model {model.name!r} was built outside "
                         f"--strategy={config.strategy}'s scope: call tfscale.setup() before "
                         "building the model")


def _apply_model_features(model: keras.Model, config: TrainConfig, strategy: Strategy,
                          recompute: BlockRule | None) -> None:
    from tfscale.training.optimizers import accumulate_gradients
    from tfscale.training.recompute import recompute_blocks
    from tfscale.training.sync_bn import synchronize_under_strategy

    accumulate_gradients(model, config.grad_accum_steps)
    if recompute is not None:
        blocks = recompute_blocks(model, recompute)
        rank_zero.log(f"--recompute: {len(blocks)} blocks keep only their inputs and "
                      "recompute their activations in the backward pass")
    if config.sync_bn:
        synchronize_under_strategy(model, strategy, config)
