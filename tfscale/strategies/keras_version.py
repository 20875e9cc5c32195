"""The Keras releases :mod:`tfscale.strategies.keras_multiworker` was made for, checked without
importing Keras.

The multi-worker fix replaces private functions of Keras's TensorFlow trainer, so it is only
trusted on the releases it was written against and tested with. The ``multiworker`` strategy
checks the version before any worker starts, in the launcher's process, which does not import
Keras (nor TensorFlow): there the installed distribution's version is read.
"""

from __future__ import annotations

import importlib.metadata
import sys

# (major, minor) releases of Keras whose trainer the fix was written against and tested with.
TESTED_KERAS = ((3, 15),)


def keras_version_text() -> str:
    """The version of the Keras this process runs: the imported module's if Keras is loaded,
    else the installed distribution's (the one ``import keras`` would load)."""
    keras = sys.modules.get("keras")
    return str(keras.__version__) if keras is not None else importlib.metadata.version("keras")


def keras_version() -> tuple[int, int]:
    """The Keras (major, minor) of :func:`keras_version_text`."""
    major, minor = keras_version_text().split(".")[:2]
    return int(major), int(minor)


def check_keras_version() -> None:
    """Raises RuntimeError unless this Keras is one the multi-worker fix was made for."""
    if keras_version() not in TESTED_KERAS:
        tested = ", ".join(f"{a}.{b}.x" for a, b in TESTED_KERAS)
        major, minor = TESTED_KERAS[-1]
        raise RuntimeError(
            f"tfscale.multiworker replaces private functions of Keras's TensorFlow trainer and "
            f"was made for Keras {tested}; this environment has Keras {keras_version_text()}. "
            f"Install a tested Keras (pip install 'keras>={major}.{minor},<{major}.{minor + 1}') "
            "or check whether this Keras trains under MultiWorkerMirroredStrategy without the "
            "fix (docs/MIGRATING.md)")
