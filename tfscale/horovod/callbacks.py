"""``horovod.tensorflow.keras.callbacks`` for Keras 3, on tfscale's own callbacks.

Same names, arguments and behaviour as Horovod's; what differs is underneath. Horovod 0.28's
versions read ``optimizer.lr`` and ``keras.backend.get_value`` and broadcast Keras variables
as ``tf.Variable``s, none of which Keras 3 has. Broadcast and metric averaging are tfscale's
:class:`~tfscale.callbacks.BroadcastInitialState` and :class:`~tfscale.callbacks.MetricAverage`
over Horovod's collectives (host values through the node exchange of
:mod:`tfscale.scripts.horovod_api` where it has one); chief-only saving is
:class:`~tfscale.callbacks.ChiefOnly`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import keras

from tfscale.callbacks import BroadcastInitialState, ChiefOnly, MetricAverage
from tfscale.cluster import rank_zero
from tfscale.exchange import horovod_runtime as runtime
from tfscale.scripts.horovod_api import ScriptCollectives


class BroadcastGlobalVariablesCallback(BroadcastInitialState):
    """Gives every worker rank ``root_rank``'s weights and optimizer state when training
    begins, so workers that started from different random weights (or restored different
    checkpoints) train identically.

    Args:
        root_rank: the rank whose variables win.
        device: accepted for compatibility; Horovod places the broadcast itself.
    """

    def __init__(self, root_rank: int = 0, device: str = "") -> None:
        super().__init__(ScriptCollectives(), root=root_rank)


class MetricAverageCallback(MetricAverage):
    """Replaces each epoch's logged metrics by their average over all workers. Put it before
    callbacks that read the logs (ReduceLROnPlateau, TensorBoard, checkpoints, early stopping)
    so they see job-wide values.

    Args:
        device: accepted for compatibility.
    """

    def __init__(self, device: str = "") -> None:
        super().__init__(ScriptCollectives())


def _training_optimizer(model: keras.Model) -> Any:
    """The optimizer whose slots hold the momentum (inside a LossScaleOptimizer, the inner)."""
    optimizer = model.optimizer
    return getattr(optimizer, "inner_optimizer", optimizer)


class LearningRateScheduleCallback(keras.callbacks.Callback):
    """Sets the learning rate to ``initial_lr * multiplier(epoch)`` for epochs in
    ``[start_epoch, end_epoch)``.

    With ``staircase=True`` the rate changes at the first batch of each epoch, with the
    epoch number as an integer; otherwise before every batch, with the fractional epoch
    ``epoch + batch / steps_per_epoch``. A constant ``multiplier`` ``m`` means ``m ** (epoch -
    start_epoch)`` (exponential decay).

    Momentum correction (Goyal et al. 2017, section 2.2): when the rate changes from ``old``
    to ``new``, an SGD optimizer's velocity is scaled by ``new / old`` for that step, which is
    what Horovod obtains by scaling the momentum coefficient for one batch (Keras 3 compiles
    the coefficient into the training step, so the velocity is scaled instead).

    Args:
        initial_lr: the rate the multiplier scales; ``None`` takes the optimizer's rate when
            training begins.
        multiplier: a number, or a function of the (fractional) epoch.
        start_epoch: first epoch adjusted.
        end_epoch: first epoch no longer adjusted (``None``: never stops).
        staircase: adjust per epoch (True) or per batch (False).
        momentum_correction: rescale SGD's velocity when the rate changes.
        steps_per_epoch: batches per epoch; by default what ``model.fit`` says.

    Raises:
        ValueError: when training begins with an optimizer whose rate is a schedule, or when
            a per-batch schedule cannot tell the number of steps per epoch.
    """

    def __init__(self, initial_lr: float | None, multiplier: float | Callable[[float], float],
                 start_epoch: int = 0, end_epoch: int | None = None, staircase: bool = True,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None) -> None:
        super().__init__()
        self.initial_lr = initial_lr
        if callable(multiplier):
            self.multiplier = multiplier
        else:
            self.multiplier = lambda epoch: float(multiplier) ** (epoch - start_epoch)
        self.start_epoch = start_epoch
        self.end_epoch = end_epoch
        self.staircase = staircase
        self.momentum_correction = momentum_correction
        self.steps_per_epoch = steps_per_epoch
        self.current_epoch = 0

    @property
    def learning_rate(self) -> float:
        return float(keras.ops.convert_to_numpy(self.model.optimizer.learning_rate))

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if not hasattr(self.model.optimizer.learning_rate, "assign"):
            raise ValueError(f"{type(self).__name__} sets the optimizer's learning rate, but the "
                             "optimizer has a schedule; give it a number instead")
        if self.initial_lr is None:
            self.initial_lr = self.learning_rate
        if not self.staircase and not self.steps_per_epoch:
            self.steps_per_epoch = self.params.get("steps")
            if not self.steps_per_epoch:
                raise ValueError(f"{type(self).__name__} cannot tell the steps per epoch from "
                                 "model.fit; pass steps_per_epoch=")

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self.current_epoch = epoch

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        epoch = self.current_epoch
        if epoch < self.start_epoch or (self.end_epoch is not None and epoch >= self.end_epoch):
            return
        assert self.initial_lr is not None  # set by on_train_begin at the latest
        if self.staircase:
            if batch == 0:
                self.set_learning_rate(self.initial_lr * self.multiplier(epoch))
        else:
            assert self.steps_per_epoch
            self.set_learning_rate(
                self.initial_lr * self.multiplier(epoch + batch / self.steps_per_epoch))

    def set_learning_rate(self, new_lr: float) -> None:
        """Sets the rate, correcting the momentum for the change."""
        old_lr = self.learning_rate
        self.model.optimizer.learning_rate = new_lr
        optimizer = _training_optimizer(self.model)
        if (self.momentum_correction and old_lr and new_lr != old_lr
                and getattr(optimizer, "momentums", None)):
            for velocity in optimizer.momentums:
                velocity.assign(velocity * (new_lr / old_lr))

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            logs["lr"] = self.learning_rate


class LearningRateWarmupCallback(LearningRateScheduleCallback):
    """Gradual warmup (Goyal et al. 2017): the rate rises linearly from ``initial_lr / size``
    to ``initial_lr`` over ``warmup_epochs`` epochs, adjusted before every batch.

    ``initial_lr`` is the rate scaled for ``size`` workers; the warmup starts at the
    single-worker rate. As in Horovod, the rate reached at the end of batch ``b`` of epoch
    ``e`` is the one for the fractional epoch ``e + (b + 1) / steps_per_epoch``, so epoch
    ``warmup_epochs`` ends exactly at ``initial_lr``. For a warmup in steps, pass
    ``steps_per_epoch`` and a fractional ``warmup_epochs = steps / steps_per_epoch``.

    Args:
        initial_lr: the rate after warmup (``None``: the optimizer's rate at train begin).
        warmup_epochs: length of the warmup, in epochs.
        momentum_correction: as for :class:`LearningRateScheduleCallback`.
        steps_per_epoch: batches per epoch; by default what ``model.fit`` says.
        verbose: 1 prints a line on the chief when the warmup ends.
    """

    def __init__(self, initial_lr: float | None, warmup_epochs: float = 5,
                 momentum_correction: bool = True, steps_per_epoch: int | None = None,
                 verbose: int = 0) -> None:
        def multiplier(epoch: float) -> float:
            assert self.steps_per_epoch
            workers = runtime.size()
            epoch += 1.0 / self.steps_per_epoch
            return (1.0 + epoch * (workers - 1) / warmup_epochs) / workers

        super().__init__(initial_lr, multiplier, start_epoch=0,
                         end_epoch=math.ceil(warmup_epochs), staircase=False,
                         momentum_correction=momentum_correction, steps_per_epoch=steps_per_epoch)
        self.warmup_epochs = warmup_epochs
        self.verbose = verbose

    def on_train_batch_begin(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        assert self.steps_per_epoch
        if self.current_epoch + batch / self.steps_per_epoch < self.warmup_epochs:
            super().on_train_batch_begin(batch, logs)

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_epoch_end(epoch, logs)
        if self.verbose and self.end_epoch is not None and epoch == self.end_epoch - 1:
            rank_zero.log(f"\nEpoch {epoch + 1}: finished gradual learning rate warmup to "
                          f"{self.learning_rate:g}.")


class BestModelCheckpoint(ChiefOnly):
    """Saves the model whenever the monitored metric improves, on the chief only (Keras's
    ``ModelCheckpoint`` with ``save_best_only=True``). With :class:`MetricAverageCallback`
    earlier in the list, "improves" is judged on the job-wide average.

    Args:
        filepath: where to save (``.keras``, or ``.weights.h5`` with ``save_weights_only``);
            Horovod's version took it later from its Spark estimator, here it is required.
        monitor, verbose, save_weights_only, mode, save_freq: as for ``ModelCheckpoint``.
    """

    def __init__(self, filepath: str, monitor: str = "val_loss", verbose: int = 0,
                 save_weights_only: bool = False, mode: str = "auto",
                 save_freq: str | int = "epoch") -> None:
        super().__init__(keras.callbacks.ModelCheckpoint(
            filepath, monitor=monitor, verbose=verbose, save_best_only=True,
            save_weights_only=save_weights_only, mode=mode, save_freq=save_freq))
