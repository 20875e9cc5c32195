"""The shared-memory exchange as TensorFlow ops, built from ``node_all_reduce.cc`` on first use.

:mod:`tfscale.exchange.shared_memory` runs each call in ``tf.numpy_function``: TensorFlow hands
the gradients to Python, the interpreter runs the copies, the sum and the waits, and the
outputs go back. The ops do the same steps on the same segment from TensorFlow's executor, so
a step's exchange costs no host call and no Python: ``TfscaleNodeAllReduce``, the whole
all-reduce of a job on one node (on a 2-core AMD EPYC, horovod's 2-worker ``mlp`` ran 4-5%
faster with it; bench/RESULTS.md), and ``TfscaleNodeReduceScatter`` and
``TfscaleNodeAllGather``, the node phases around the cross-node sum of a job on several.

The library is compiled once per TensorFlow version and source (its bytes, wherever it lies:
checkouts and installs share one build), with the compiler that built Horovod (``$CXX``, else
``g++``) and the flags ``tf.sysconfig`` gives, into ``$XDG_CACHE_HOME/tfscale/native``
(``~/.cache``), under a lock, so the processes of a job starting together build it once.
Where it cannot be built or loaded, the exchange stays in ``tf.numpy_function`` and one
warning says why. ``TFSCALE_NATIVE_EXCHANGE=0`` keeps it there on purpose (benchmarks compare
the two).

    python -m tfscale.exchange.native   # builds it now (launch/setup.sh does), prints its path
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path
from types import ModuleType

SOURCE = Path(__file__).with_name("node_all_reduce.cc")
SWITCH = "TFSCALE_NATIVE_EXCHANGE"
BUILD_TIMEOUT_S = 600


def cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(root) / "tfscale" / "native"


def _command(output: Path, source: Path | None = None) -> list[str]:
    import tensorflow as tf

    compiler = os.environ.get("CXX") or "g++"
    return [compiler, "-O3", "-shared", "-fPIC", "-ffp-contract=off", "-w", str(source or SOURCE),
            "-o", str(output), *tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]


def library_path() -> Path:
    """Where this TensorFlow's build of the op is (or will be) kept."""
    import tensorflow as tf

    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    key.update(tf.__version__.encode())
    key.update(" ".join(_command(Path("out"), Path(SOURCE.name))).encode())
    return cache_dir() / f"node_all_reduce-{key.hexdigest()[:16]}.so"


def build() -> Path:
    """Compiles the op unless this TensorFlow's build is already there; returns its path.

    Raises:
        RuntimeError: no compiler, or it failed (its first lines of errors in the message).
    """
    target = library_path()
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    command = _command(target.with_suffix(f".{os.getpid()}.tmp"))
    if shutil.which(command[0]) is None:
        raise RuntimeError(f"no C++ compiler {command[0]!r} on PATH (set CXX to one)")
    with open(target.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another process may be building it right now
        if target.exists():
            return target
        try:
            done = subprocess.run(command, capture_output=True, text=True,
                                  timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"compiling {SOURCE} took over {BUILD_TIMEOUT_S} s") from None
        temporary = Path(command[command.index("-o") + 1])
        if done.returncode != 0:
            with contextlib.suppress(FileNotFoundError):
                temporary.unlink()
            errors = "\n".join(done.stderr.strip().splitlines()[:8])
            raise RuntimeError(f"compiling {SOURCE} failed ({' '.join(command[:6])} ...):\n"
                               f"{errors}")
        temporary.rename(target)
    return target


@functools.cache
def library() -> ModuleType | None:
    """The loaded op library, or None (with one warning saying why) where the exchange must
    stay in ``tf.numpy_function``; None without a warning under ``TFSCALE_NATIVE_EXCHANGE=0``."""
    if os.environ.get(SWITCH, "1") == "0":
        return None
    import tensorflow as tf

    try:
        return tf.load_op_library(str(build()))
    except (RuntimeError, OSError, tf.errors.NotFoundError) as err:
        warnings.warn(f"tfscale: the shared-memory exchange runs in tf.numpy_function, not as "
                      f"its TensorFlow op: {err}", stacklevel=2)
        return None


def main() -> int:
    """Builds the op (if this TensorFlow has no build of it yet) and prints its path."""
    try:
        print(build())
    except RuntimeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    return 0


