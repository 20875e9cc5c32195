"""tfscale: train Keras 3 models from one core to a supercomputer under pluggable strategies.

The public face: ``tfscale.prepare``/``tfscale.setup``/``tfscale.shard_dataset`` for your own
script, :mod:`tfscale.callbacks` (Keras callbacks for your own ``model.fit``),
:mod:`tfscale.horovod` (Horovod's Keras API for Keras 3), :mod:`tfscale.multiworker` (the
MultiWorkerMirroredStrategy fix) and the commands (``python -m tfscale.train``, ``tfscale.run``,
``tfscale.sweep``, ``tfscale.predict``, ``tfscale.forecast``).

The packages below, by role: :mod:`~tfscale.cli` (commands and flags), :mod:`~tfscale.scripts`
(what users' scripts use), :mod:`~tfscale.training` (the trainer and what it applies and
writes), :mod:`~tfscale.strategies`, :mod:`~tfscale.exchange` (everything that moves
gradients), :mod:`~tfscale.cluster` (a process's place in its job), :mod:`~tfscale.config`
(options and registries) and :mod:`~tfscale.forecast`. Modules that lived elsewhere before
stay importable under their old names for a release (:mod:`tfscale.config.moved`).
"""

from typing import TYPE_CHECKING, Any

from tfscale.config import moved as _moved

_moved.install()

__version__ = "0.1.0"

# Your own script's entry points (tfscale.prepare), loaded on first use: importing tfscale
# stays free of TensorFlow for the command-line tools.
_PREPARE = ("Prepared", "prepare", "setup", "shard_arrays", "shard_dataset")
__all__ = ["Prepared", "__version__", "prepare", "setup", "shard_arrays", "shard_dataset"]

if TYPE_CHECKING:
    from tfscale.scripts.prepare import Prepared, prepare, setup, shard_arrays, shard_dataset


def __getattr__(name: str) -> Any:
    if name in _PREPARE:
        from tfscale.scripts import prepare as module

        return getattr(module, name)
    raise AttributeError(f"module 'tfscale' has no attribute {name!r}")
