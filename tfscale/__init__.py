"""tfscale: train Keras 3 models from one core to a supercomputer under pluggable strategies.

Entry points: ``python -m tfscale.train`` (training), ``tfscale.callbacks`` (Keras callbacks for
your own ``model.fit``), ``python -m tfscale.sweep`` (flag sweeps).
"""

__version__ = "0.1.0"
