"""tfscale: train Keras 3 models from one core to a supercomputer under pluggable strategies.

Entry points: ``python -m tfscale.train`` (training), ``tfscale.callbacks`` (Keras callbacks for
your own ``model.fit``), ``python -m tfscale.sweep`` (flag sweeps).
"""

from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# Your own script's entry points (tfscale.prepare), loaded on first use: importing tfscale
# stays free of TensorFlow for the command-line tools.
_PREPARE = ("Prepared", "prepare", "setup", "shard_arrays", "shard_dataset")
__all__ = ["Prepared", "__version__", "prepare", "setup", "shard_arrays", "shard_dataset"]

if TYPE_CHECKING:
    from tfscale._prepare import Prepared, prepare, setup, shard_arrays, shard_dataset


def __getattr__(name: str) -> Any:
    if name in _PREPARE:
        from tfscale import _prepare as module

        return getattr(module, name)
    raise AttributeError(f"module 'tfscale' has no attribute {name!r}")
