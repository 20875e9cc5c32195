"""Broadcast of the initial model and optimizer state from one worker to all."""

from __future__ import annotations

from typing import Any

import keras

from tfscale.callbacks.collectives import Collectives, default_collectives


class BroadcastInitialState(keras.callbacks.Callback):
    """At the start of training, gives every worker rank ``root``'s weights and optimizer
    state, so that workers initialised (or restored) differently start identical.

    Args:
        comm: collectives to use; default Horovod's (for a plain ``model.fit`` under horovodrun).
        root: the rank whose state wins.
    """

    def __init__(self, comm: Collectives | None = None, root: int = 0) -> None:
        super().__init__()
        self._comm = comm
        self.root = root
        self.done = False

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self.done:
            return
        comm = default_collectives(self._comm)
        variables = list(self.model.weights)
        optimizer = getattr(self.model, "optimizer", None)
        # Keras builds the optimizer lazily; a fresh optimizer's slots are zeros everywhere, so
        # only a built (possibly restored) one needs its state sent.
        if optimizer is not None and optimizer.built:
            variables += list(optimizer.variables)
        comm.broadcast_variables(variables, self.root)
        self.done = True
