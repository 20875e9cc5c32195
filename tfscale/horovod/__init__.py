"""Horovod for Keras 3: ``horovod.tensorflow.keras``'s API, working under TF >= 2.16.

Horovod's own Keras layer (0.28.1, its last release) fails on Keras 3: its callbacks call
``keras.backend.get_value``, its optimizer overrides methods Keras 3 never calls (so
gradients are silently not averaged), and its broadcast rejects Keras 3 variables. A script
written for it runs here after changing one line::

    import horovod.tensorflow.keras as hvd   ->   import tfscale.horovod as hvd

then, as before::

    hvd.init()
    opt = hvd.DistributedOptimizer(keras.optimizers.Adam(0.001 * hvd.size()))
    model.compile(optimizer=opt, loss=...)
    model.fit(dataset, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                  hvd.callbacks.MetricAverageCallback(), ...])

and run it with ``tfscale-run --nproc=N --strategy=horovod script.py``, ``horovodrun -np N
python script.py`` or any launcher Horovod supports. Where the ranks of a node all see the same
``/dev/shm`` (CPU-only x86-64), ``DistributedOptimizer``, eager ``allreduce``/``broadcast`` and
the callbacks' host values go through the shared-memory node exchange that ``tfscale.train
--strategy=horovod`` uses (hierarchically with Horovod across nodes), not Gloo over loopback;
``TFSCALE_NODE_EXCHANGE=collectives`` keeps them on Horovod (:mod:`tfscale.scripts.horovod_api`).
Horovod's constants (``Average``, ``Sum``, ``Compression``, ``global_process_set``, ...) are
Horovod's own, looked up on first use. Horovod ops cannot run inside an XLA-compiled function
in tfscale's build, and Keras 3's default ``jit_compile="auto"`` compiles the training step
with XLA when a GPU is visible: on GPUs pass ``jit_compile=False`` to ``compile``. See
docs/MIGRATING.md.

This package is the public face only: the functions and the optimizer live in the collectives
layer (:mod:`tfscale.exchange`), which tfscale's strategies and callbacks share;
``hvd.callbacks`` sits on :mod:`tfscale.callbacks`, which sits on that layer.
"""

from typing import Any

from tfscale.exchange.horovod_runtime import (
    allgather,
    broadcast_variables,
    cross_rank,
    cross_size,
    is_initialized,
    local_rank,
    local_size,
    rank,
    size,
)
from tfscale.horovod import callbacks
from tfscale.scripts.horovod_api import (
    DistributedOptimizer,
    allreduce,
    broadcast,
    init,
    load_model,
    shutdown,
)

# Names that are Horovod's own objects, the same under Keras 2 and 3.
_FROM_HOROVOD = ("Average", "Sum", "Adasum", "Min", "Max", "Product", "Compression",
                 "ProcessSet", "global_process_set", "add_process_set", "remove_process_set",
                 "mpi_built", "gloo_built", "nccl_built", "mpi_enabled", "gloo_enabled",
                 "start_timeline", "stop_timeline")


def __getattr__(name: str) -> Any:
    if name in _FROM_HOROVOD:
        from tfscale.exchange.horovod_runtime import import_horovod

        return getattr(import_horovod(), name)
    raise AttributeError(f"module 'tfscale.horovod' has no attribute {name!r}")


__all__ = ["DistributedOptimizer", "allgather", "allreduce", "broadcast", "broadcast_variables",
           "callbacks", "cross_rank", "cross_size", "init", "is_initialized", "load_model",
           "local_rank", "local_size", "rank", "shutdown", "size", *_FROM_HOROVOD]
