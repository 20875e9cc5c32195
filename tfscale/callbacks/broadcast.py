"""Broadcast of the initial model and optimizer state from one worker to all."""

from __future__ import annotations

from typing import Any

import keras

from tfscale.exchange.interface import Collectives, default_collectives


class BroadcastInitialState(keras.callbacks.Callback):
    """At the start of training, gives every worker rank ``root``'s weights and optimizer
    state, so that workers initialised (or restored) differently start identical.

    A model whose input shape is not declared has no weights until its first step builds it;
    then the broadcast happens right after that step (as Horovod's callback does), and the
    workers are identical from the second step on.

    Args:
        comm: collectives to use; default Horovod's (for a plain ``model.fit`` under horovodrun).
        root: the rank whose state wins.
    """

    def __init__(self, comm: Collectives | None = None, root: int = 0) -> None:
        super().__init__()
        self._comm = comm
        self.root = root
        self.done = False

    def broadcast(self) -> None:
        """Sends ``root``'s model and (built) optimizer variables to every worker, once."""
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

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        # Every worker sees the same model, so all take the same branch.
        if self.model.weights:
            self.broadcast()

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self.broadcast()
