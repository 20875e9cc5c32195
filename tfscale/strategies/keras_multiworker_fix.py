"""Work-arounds that let Keras 3's ``model.fit`` run under MultiWorkerMirroredStrategy.

Upstream causes (Keras 3.15.1, TF 2.21; remove these once Keras fixes them):

1. ``keras/src/backend/tensorflow/trainer.py``, ``TensorFlowTrainer._maybe_symbolic_build``:
   to build the model before the first step it averages one distributed input batch with
   ``strategy.reduce("MEAN", batch, axis=None)``, which fails for a multi-worker strategy
   ("Attempt to convert a value (PerReplica...)"). A symbolic build only needs shapes and
   dtypes, so we build from the first local replica's batch.
2. Same file, ``reduce_per_replica``: for multi-worker collective strategies it reduces every
   train-step output with ``strategy.reduce("MEAN", v, axis=0)``, which fails on the scalar
   loss and metric logs ("Invalid reduction dimension 0"); Keras hard-codes
   ``reduction="auto"`` there. We reduce scalars with ``axis=None`` (the cross-worker mean,
   which is what the logs should show) and leave everything else to Keras.

Both are applied by the multiworker strategy only, for the duration of its run.
"""

from __future__ import annotations

import contextlib
import types
from collections.abc import Iterator
from typing import Any

import keras
import tensorflow as tf
from keras.src.backend.tensorflow import trainer as tf_trainer


def _first_local_replica(value: Any, strategy: tf.distribute.Strategy) -> Any:
    if isinstance(value, tf.distribute.DistributedValues):
        return strategy.experimental_local_results(value)[0]
    return value


def _symbolic_build_from_local_batch(
    self: keras.Model, iterator: Any = None, data_batch: Any = None
) -> None:
    if self._distribute_strategy is None:
        return
    strategy = self.distribute_strategy
    if iterator is not None:
        for _, _, it in iterator:
            batch = next(it)
            data_batch = keras.tree.map_structure(
                lambda v: _first_local_replica(v, strategy), batch)
            break
    with strategy.scope():
        self._symbolic_build(data_batch=data_batch)


def patch_model(model: keras.Model) -> None:
    """Applies fix 1 to ``model`` (an instance attribute; other models are untouched)."""
    model._maybe_symbolic_build = types.MethodType(_symbolic_build_from_local_batch, model)


@contextlib.contextmanager
def scalar_safe_log_reduction() -> Iterator[None]:
    """Applies fix 2 while the context is open (it replaces a module function of Keras)."""
    original = tf_trainer.reduce_per_replica

    def reduce_per_replica(values: Any, strategy: Any, reduction: str) -> Any:
        if reduction in ("auto", "mean") and tf_trainer._collective_all_reduce_multi_worker(
                strategy):
            def reduce(v: Any) -> Any:
                axis = None if v.shape.rank == 0 else 0
                return strategy.reduce("MEAN", v, axis=axis)

            return keras.tree.map_structure(reduce, values)
        return original(values, strategy, reduction)

    tf_trainer.reduce_per_replica = reduce_per_replica
    try:
        yield
    finally:
        tf_trainer.reduce_per_replica = original
