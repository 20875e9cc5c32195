"""Optimizers and learning-rate schedules, built from the run's config."""

from __future__ import annotations

import keras

from tfscale.config.train_config import TrainConfig
from tfscale.training.optimizers.accumulation import accumulate_gradients
from tfscale.training.optimizers.lars import LARC, LARS, TrustRatioSGD
from tfscale.training.optimizers.schedules import WarmupDecay
from tfscale.training.optimizers.sgd import SGD, fuse

__all__ = ["LARC", "LARS", "SGD", "TrustRatioSGD", "WarmupDecay", "accumulate_gradients",
           "build_optimizer", "build_schedule", "exclude_bias_bn_from_decay", "fuse",
           "scaled_learning_rate"]


def scaled_learning_rate(config: TrainConfig, world_size: int) -> float:
    """The peak learning rate: under the linear scaling rule (Goyal et al. 2017),
    ``learning_rate`` times the global batch over ``batch_size``, i.e. ``world_size`` (replicas)
    x ``grad_accum_steps``; else ``learning_rate``."""
    if config.lr_scaling != "linear":
        return config.learning_rate
    return config.learning_rate * world_size * config.grad_accum_steps


def build_schedule(config: TrainConfig, world_size: int, total_steps: int) -> WarmupDecay:
    """Warmup and decay schedule for a run of ``total_steps`` optimizer steps."""
    return WarmupDecay(
        scaled_learning_rate(config, world_size), config.warmup_steps, total_steps,
        config.lr_schedule, config.decay_boundaries, config.lr_decay_factor,
    )


def build_optimizer(
    config: TrainConfig, world_size: int, total_steps: int
) -> keras.optimizers.Optimizer:
    """The optimizer named by ``config.optimizer`` with its scaled, scheduled learning rate.

    Raises:
        ValueError: for an optimizer this build does not provide.
    """
    lr = build_schedule(config, world_size, total_steps)
    wd = config.weight_decay or None
    if config.optimizer in ("sgd", "nesterov"):
        # Keras' SGD, its momentum update fused into one pass (bit for bit the same weights).
        return SGD(lr, momentum=config.momentum, nesterov=config.optimizer == "nesterov",
                   weight_decay=wd)
    if config.optimizer == "adamw":
        return keras.optimizers.AdamW(lr, weight_decay=config.weight_decay,
                                      beta_1=config.momentum)
    if config.optimizer == "lamb":
        return keras.optimizers.Lamb(lr, beta_1=config.momentum, weight_decay=wd)
    if config.optimizer == "lars":
        return LARS(lr, momentum=config.momentum, eta=config.lars_eta,
                    weight_decay=config.weight_decay,
                    exclude_bias_bn=config.lars_exclude_bias_bn)
    if config.optimizer == "larc":
        return LARC(lr, momentum=config.momentum, eta=config.lars_eta,
                    weight_decay=config.weight_decay,
                    exclude_bias_bn=config.lars_exclude_bias_bn, mode=config.larc_mode)
    raise ValueError(f"--optimizer={config.optimizer} is not available in this build")


def exclude_bias_bn_from_decay(optimizer: keras.optimizers.Optimizer,
                               variables: list[keras.Variable]) -> int:
    """No weight decay on the biases and batch-norm scales and offsets (the variables of rank
    <= 1) among ``variables`` (Goyal et al. 2017): Keras' own exclusion, for every Keras
    optimizer; LARS and LARC exclude them themselves (``--lars_exclude_bias_bn``). Call it
    before the optimizer is built. Returns the number of variables excluded."""
    if isinstance(optimizer, TrustRatioSGD):
        return 0
    excluded = [v for v in variables if len(v.shape) <= 1]
    optimizer.exclude_from_weight_decay(var_list=excluded)
    return len(excluded)
