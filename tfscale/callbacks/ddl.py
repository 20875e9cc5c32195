"""IBM DDL's callback pair for ``model.fit``: metric sync first, global-variables broadcast last.

DDL's programming model puts two callbacks at the ends of the list::

    callbacks = [DDLMetricSync(), *your_callbacks, DDLGlobalVariablesBroadcast()]

- :class:`DDLMetricSync` first: it averages each epoch's logged metrics over all learners in
  place, so every later callback (loggers, checkpoints, early stopping, Keras's History) sees
  job-wide values, and learners that decide on them (stop, save) decide alike.
- :class:`DDLGlobalVariablesBroadcast` last: at train begin it gives every learner rank 0's
  weights and optimizer state after every other callback has set them up (restored a backup,
  loaded pretrained weights), so no callback can leave learners different.

The order is checked when training begins: each callback finds the ``CallbackList`` that calls
it (Keras 3 gives a callback no handle on its siblings, so it looks at the caller's frame) and
raises ValueError naming the order to use, before any collective runs, so every learner fails
the same way instead of hanging. Outside a ``CallbackList`` (a hand-written loop), call
:func:`check_ddl_order` yourself.
"""

from __future__ import annotations

import inspect
from collections.abc import Sequence
from typing import Any

import keras

from tfscale.callbacks.broadcast import BroadcastInitialState
from tfscale.callbacks.metric_average import MetricAverage

# Callbacks Keras appends itself (after the user's list); they only record or print the logs.
_KERAS_OWN = (keras.callbacks.History, keras.callbacks.ProgbarLogger)
# How many frames up the calling CallbackList may be: in Keras 3.15 it calls the hook directly,
# which calls enforce_order; the slack covers subclasses whose hook calls super().
_CALLER_DEPTH = 8


class DDLMetricSync(MetricAverage):
    """Averages each epoch's logged metrics over all learners; must be the FIRST callback.

    Args:
        comm: collectives to use; default Horovod's (for a plain ``model.fit`` under a
            Horovod launcher).
    """

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        enforce_order(self)


class DDLGlobalVariablesBroadcast(BroadcastInitialState):
    """Gives every learner rank ``root``'s weights and optimizer state when training begins;
    must be the LAST callback.

    Args:
        comm: collectives to use; default Horovod's.
        root: the rank whose variables win.
    """

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        enforce_order(self)
        super().on_train_begin(logs)


def _name(callback: keras.callbacks.Callback) -> str:
    return type(callback).__name__


def check_ddl_order(callbacks: Sequence[keras.callbacks.Callback]) -> None:
    """Checks that ``callbacks`` (a ``model.fit`` list) has at most one of each DDL callback,
    :class:`DDLMetricSync` first and :class:`DDLGlobalVariablesBroadcast` last. Keras's own
    History and ProgbarLogger are ignored.

    Raises:
        ValueError: saying what is wrong, why the order matters, and the list to use.
    """
    listed = [c for c in callbacks if not isinstance(c, _KERAS_OWN)]
    syncs = [i for i, c in enumerate(listed) if isinstance(c, DDLMetricSync)]
    broadcasts = [i for i, c in enumerate(listed) if isinstance(c, DDLGlobalVariablesBroadcast)]
    problems = []
    for kind, found in (("DDLMetricSync", syncs), ("DDLGlobalVariablesBroadcast", broadcasts)):
        if len(found) > 1:
            problems.append(f"{kind} appears {len(found)} times (at positions {found}); "
                            "use one")
    if syncs and syncs[0] != 0:
        problems.append(
            f"DDLMetricSync is at position {syncs[0]} but must be the first callback, so that "
            "every later callback sees metrics averaged over all learners")
    if broadcasts and broadcasts[-1] != len(listed) - 1:
        problems.append(
            f"DDLGlobalVariablesBroadcast is at position {broadcasts[-1]} of {len(listed)} but "
            "must be the last callback, so that it sends rank 0's variables after every other "
            "callback has set them up at train begin")
    if not problems:
        return
    others = [c for c in listed if not isinstance(c, DDLMetricSync | DDLGlobalVariablesBroadcast)]
    fixed = (["DDLMetricSync()"] if syncs else []) + [f"{_name(c)}(...)" for c in others] + (
        ["DDLGlobalVariablesBroadcast()"] if broadcasts else [])
    raise ValueError(
        "DDL callbacks are out of order: " + "; ".join(problems) + ". Got callbacks=["
        + ", ".join(_name(c) for c in listed) + "]; pass callbacks=[" + ", ".join(fixed) + "]")


def calling_callback_list(
    callback: keras.callbacks.Callback,
) -> keras.callbacks.CallbackList | None:
    """The ``CallbackList`` on the call stack that holds ``callback``, if any."""
    frame = inspect.currentframe()
    try:
        for _ in range(_CALLER_DEPTH):
            frame = frame.f_back if frame is not None else None
            if frame is None:
                return None
            owner = frame.f_locals.get("self")
            if isinstance(owner, keras.callbacks.CallbackList) and any(
                    c is callback for c in owner.callbacks):
                return owner
        return None
    finally:
        del frame


def enforce_order(callback: keras.callbacks.Callback) -> None:
    """Runs :func:`check_ddl_order` on the list that is calling ``callback``'s hook (from
    inside the hook); nothing when no ``CallbackList`` is calling it."""
    owner = calling_callback_list(callback)
    if owner is not None:
        check_ddl_order(owner.callbacks)
