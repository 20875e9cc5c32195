"""Host collectives through a ``tf.distribute`` strategy: one cached all-gather per strategy.

For tfscale's mirrored and multiworker strategies and for callbacks in users' own
``tf.distribute`` scripts. TensorFlow is imported on first use, so importing this module loads
none of it.
"""

from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any

import numpy as np

from tfscale.exchange.interface import reduce_rows

if TYPE_CHECKING:
    import tensorflow as tf

_GATHERS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def gather_rows(strategy: tf.distribute.Strategy, values: np.ndarray) -> np.ndarray:
    """Every replica's copy of ``values`` under ``strategy``, stacked: ``[replicas, *shape]``
    (one cached all-gather function per strategy; a collective: every worker calls it)."""
    import tensorflow as tf

    if strategy not in _GATHERS:
        def replica_fn(x: tf.Tensor) -> tf.Tensor:
            ctx = tf.distribute.get_replica_context()
            return ctx.all_gather(x[tf.newaxis], axis=0)

        _GATHERS[strategy] = tf.function(lambda t: strategy.run(replica_fn, args=(t,)))
    out = _GATHERS[strategy](tf.constant(values))
    return np.asarray(strategy.experimental_local_results(out)[0].numpy())


def process_sum(strategy: tf.distribute.Strategy, processes: int, values: np.ndarray
                ) -> np.ndarray:
    """The sum over ``processes`` processes of each one's float64 ``values`` (each counted
    once, whatever its number of local replicas)."""
    rows = gather_rows(strategy, np.asarray(values, np.float64).reshape(-1))
    return reduce_rows(rows[:: int(strategy.num_replicas_in_sync) // processes], "sum")
