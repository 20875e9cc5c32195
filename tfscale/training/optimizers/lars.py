"""Layer-wise adaptive rate optimizers for large-batch training: LARS and LARC.

Both scale each variable's step by a trust ratio (You, Gitman & Ginsburg 2017,
https://arxiv.org/abs/1708.03888)::

    trust = eta * ||w|| / (||g|| + weight_decay * ||w|| + epsilon)

and then take an SGD step with momentum, the learning rate inside the velocity as in the LARS
paper's Algorithm 1 and in Keras' SGD::

    v = momentum * v + step;   w = w - v

They differ in how ``step`` is formed:

- :class:`LARS` (the paper): ``step = lr * trust * (g + weight_decay * w)``; the trust ratio falls
  back to 1 when ``||w||`` or ``||g||`` is 0.
- :class:`LARC` (NVIDIA apex's ``apex.parallel.LARC``): the adaptive factor is ``trust`` in
  ``"scale"`` mode and ``min(trust / lr, 1)`` in ``"clip"`` mode, so that the effective rate is
  ``min(trust, lr)``; ``step = lr * factor * (g + weight_decay * w)``. As in apex, a variable whose
  ``||w||`` or ``||g||`` is 0 takes the plain step ``lr * g``, without adaptation or decay. apex
  wraps a torch SGD, which keeps ``lr`` out of the velocity; with a constant learning rate the
  two forms give the same weights.

Weight decay is coupled (added to the gradient before the momentum), so Keras' decoupled decay is
switched off. Variables for which :meth:`exclude_from_adaptation` is true (by default every
variable of rank <= 1: biases and batch-norm scales and offsets) take ``step = lr * g``: no trust
ratio and no weight decay.

All arithmetic uses ``keras.ops`` on the variable's own dtype, so the optimizers run in eager
mode, inside ``tf.function``/XLA, under ``tf.distribute`` (Keras reduces the gradients before
``update_step``, so the norms are those of the global gradient) and inside a
``keras.optimizers.LossScaleOptimizer``.
"""

from __future__ import annotations

import abc
import re
from collections.abc import Sequence
from typing import Any

import keras
from keras import ops

from tfscale.config.train_config import LARC_MODES  # one list, which --larc_mode checks too


class TrustRatioSGD(keras.optimizers.Optimizer, metaclass=abc.ABCMeta):
    """Momentum SGD whose per-variable step is shaped by a layer-wise trust ratio.

    The shared base of :class:`LARS` and :class:`LARC`; subclasses say how the trust ratio turns
    into a step in :meth:`adapted_step`.

    Args:
        learning_rate: a float or a ``keras.optimizers.schedules.LearningRateSchedule``: the
            global learning rate.
        momentum: momentum coefficient, in [0, 1).
        eta: trust coefficient (``lars_eta``), > 0.
        weight_decay: coefficient of the L2 term added to the gradient, >= 0.
        epsilon: added to the trust ratio's denominator for numerical safety, >= 0.
        exclude_bias_bn: exclude variables of rank <= 1 (biases, batch-norm parameters) from
            adaptation and weight decay.
        exclude_patterns: regular expressions; a variable whose path matches one is excluded too.
        name: the optimizer's name.
        **kwargs: further ``keras.optimizers.Optimizer`` arguments (``clipnorm``, ``use_ema``,
            ``gradient_accumulation_steps``, ...).

    Raises:
        ValueError: naming the argument when ``momentum``, ``eta``, ``weight_decay`` or
            ``epsilon`` is out of range.
    """

    def __init__(
        self,
        learning_rate: float | keras.optimizers.schedules.LearningRateSchedule = 0.1,
        momentum: float = 0.9,
        eta: float = 0.001,
        weight_decay: float = 0.0,
        epsilon: float = 1e-8,
        exclude_bias_bn: bool = True,
        exclude_patterns: Sequence[str] = (),
        name: str | None = None,
        **kwargs: Any,
    ) -> None:
        if not 0.0 <= momentum < 1.0:
            raise ValueError(f"momentum={momentum} is not valid; expected a value in [0, 1)")
        if not eta > 0.0:
            raise ValueError(f"eta={eta} is not valid; expected a value > 0")
        for arg, value in (("weight_decay", weight_decay), ("epsilon", epsilon)):
            if value < 0.0:
                raise ValueError(f"{arg}={value} is not valid; expected a value >= 0")
        super().__init__(learning_rate=learning_rate, weight_decay=float(weight_decay),
                         name=name, **kwargs)
        self.momentum = float(momentum)
        self.eta = float(eta)
        self.epsilon = float(epsilon)
        self.exclude_bias_bn = bool(exclude_bias_bn)
        self.exclude_patterns = tuple(exclude_patterns)
        self._exclude_regexes = [re.compile(p) for p in self.exclude_patterns]

    def exclude_from_adaptation(self, variable: Any) -> bool:
        """Whether ``variable`` (a model variable) skips the trust ratio and weight decay.

        True for variables of rank <= 1 when ``exclude_bias_bn`` is set, and for variables
        whose path matches one of ``exclude_patterns``. Override to choose differently.
        """
        if self.exclude_bias_bn and len(variable.shape) <= 1:
            return True
        path = getattr(variable, "path", variable.name)
        return any(regex.search(path) for regex in self._exclude_regexes)

    def build(self, variables: list[Any]) -> None:
        """Creates one velocity per variable and decides, once, which variables are adapted."""
        if self.built:
            return
        super().build(variables)
        self._velocities = self.add_optimizer_variables(variables, "velocity")
        # update_step may be handed the backend's variable (under tf.distribute, a per-device
        # tf.Variable without a Keras path), so the decision is made here on model variables.
        self._adapted = tuple(not self.exclude_from_adaptation(v) for v in variables)

    def trust_ratio(self, gradient: Any, variable: Any) -> tuple[Any, Any]:
        """The trust ratio ``eta * ||w|| / (||g|| + weight_decay * ||w|| + epsilon)``.

        Returns:
            ``(ratio, trusted)``: the ratio, and a boolean scalar that is false when ``||w||``
            or ``||g||`` is 0, where the ratio is not meaningful.
        """
        w_norm = ops.sqrt(ops.sum(ops.square(variable)))
        g_norm = ops.sqrt(ops.sum(ops.square(gradient)))
        decay = ops.cast(self.weight_decay, w_norm.dtype)
        denominator = g_norm + decay * w_norm + ops.cast(self.epsilon, w_norm.dtype)
        ratio = ops.cast(self.eta, w_norm.dtype) * w_norm / denominator
        trusted = ops.logical_and(ops.greater(w_norm, 0), ops.greater(g_norm, 0))
        return ratio, trusted

    def decayed_gradient(self, gradient: Any, variable: Any) -> Any:
        """``gradient + weight_decay * variable``."""
        return gradient + ops.cast(self.weight_decay, variable.dtype) * variable

    @abc.abstractmethod
    def adapted_step(self, gradient: Any, variable: Any, learning_rate: Any) -> Any:
        """The step, learning rate included, added to the velocity of an adapted variable."""

    def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
        """``v = momentum * v + step; w -= v``, with ``step`` from :meth:`adapted_step`, or
        ``learning_rate * gradient`` for an excluded variable."""
        index = self._get_variable_index(variable)
        learning_rate = ops.cast(learning_rate, variable.dtype)
        if hasattr(gradient, "indices"):
            # A sparse gradient (an embedding's IndexedSlices) is densified, summing repeated
            # rows: the norm and the decay need all of it.
            gradient = ops.add(ops.zeros_like(variable), gradient)
        gradient = ops.cast(gradient, variable.dtype)
        if self._adapted[index]:
            step = self.adapted_step(gradient, variable, learning_rate)
        else:
            step = learning_rate * gradient
        velocity = self._velocities[index]
        momentum = ops.cast(self.momentum, variable.dtype)
        self.assign(velocity, momentum * velocity + step)
        self.assign_sub(variable, velocity)

    def _apply_weight_decay(self, variables: list[Any]) -> None:
        """No-op: the decay is coupled into the gradient in :meth:`update_step`, not applied
        to the weights separately as Keras does for ``weight_decay``."""

    def get_config(self) -> dict[str, Any]:
        config: dict[str, Any] = super().get_config()
        config.update({
            "momentum": self.momentum, "eta": self.eta, "epsilon": self.epsilon,
            "exclude_bias_bn": self.exclude_bias_bn,
            "exclude_patterns": list(self.exclude_patterns),
        })
        return config


@keras.saving.register_keras_serializable(package="tfscale")
class LARS(TrustRatioSGD):
    """Layer-wise Adaptive Rate Scaling (You, Gitman & Ginsburg 2017).

    ``v = momentum * v + lr * trust * (g + weight_decay * w); w -= v``, with ``trust`` falling
    back to 1 when ``||w||`` or ``||g||`` is 0. Arguments as for :class:`TrustRatioSGD`.
    """

    def adapted_step(self, gradient: Any, variable: Any, learning_rate: Any) -> Any:
        ratio, trusted = self.trust_ratio(gradient, variable)
        local_rate = ops.where(trusted, ratio, ops.ones_like(ratio))
        return learning_rate * local_rate * self.decayed_gradient(gradient, variable)


@keras.saving.register_keras_serializable(package="tfscale")
class LARC(TrustRatioSGD):
    """Layer-wise Adaptive Rate Control, as NVIDIA apex's ``LARC`` applies it to SGD.

    Args:
        *args: as for :class:`TrustRatioSGD`.
        mode: ``"clip"``: the effective rate is ``min(trust, lr)`` (apex ``clip=True``);
            ``"scale"``: it is ``lr * trust`` (apex ``clip=False``).
        **kwargs: as for :class:`TrustRatioSGD`.

    Raises:
        ValueError: for a ``mode`` other than ``"clip"`` or ``"scale"``.
    """

    def __init__(self, *args: Any, mode: str = "clip", **kwargs: Any) -> None:
        if mode not in LARC_MODES:
            raise ValueError(f"mode={mode!r} is not valid; choose one of: {', '.join(LARC_MODES)}")
        super().__init__(*args, **kwargs)
        self.mode = mode

    def adapted_step(self, gradient: Any, variable: Any, learning_rate: Any) -> Any:
        ratio, trusted = self.trust_ratio(gradient, variable)
        # lr * min(trust / lr, 1) written without the division, which a zero lr would break.
        rate = (ops.minimum(ratio, learning_rate) if self.mode == "clip"
                else learning_rate * ratio)
        return ops.where(trusted, rate * self.decayed_gradient(gradient, variable),
                         learning_rate * gradient)

    def get_config(self) -> dict[str, Any]:
        config = super().get_config()
        config["mode"] = self.mode
        return config
