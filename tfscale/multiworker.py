"""``model.fit`` under ``tf.distribute.MultiWorkerMirroredStrategy`` with Keras 3: one call.

Keras 3 fails to train under MultiWorkerMirroredStrategy (its maintainers say the strategy is
not supported in Keras 3); this fixes it for the process::

    import tfscale.multiworker
    tfscale.multiworker.enable()

    strategy = tf.distribute.MultiWorkerMirroredStrategy()     # TF_CONFIG as usual
    with strategy.scope():
        model = build_and_compile()
    model.fit(tfscale.multiworker.per_worker_dataset(my_shard.batch(64)), epochs=3)

This module is the public face; the fix itself, what it replaces in Keras and why, is in
:mod:`tfscale.strategies.keras_multiworker` (the ``multiworker`` strategy runs on it too).
"""

from __future__ import annotations

from tfscale.strategies.keras_multiworker import (
    all_reduce_of,
    average_logs_with,
    disable,
    enable,
    enabled,
    is_enabled,
    keep_logs_local,
    per_worker_dataset,
    sum_gradients_with,
)

__all__ = ["all_reduce_of", "average_logs_with", "disable", "enable", "enabled", "is_enabled",
           "keep_logs_local", "per_worker_dataset", "sum_gradients_with"]
