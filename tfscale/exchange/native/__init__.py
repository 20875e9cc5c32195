"""The shared-memory exchange as TensorFlow ops, built from ``node_all_reduce.cc`` on first use.

:mod:`tfscale.exchange.shared_memory` runs each call in ``tf.numpy_function``: TensorFlow hands
the gradients to Python, the interpreter runs the copies, the sum and the waits, and the
outputs go back. The ops do the same steps on the same segment from TensorFlow's executor, so
a step's exchange costs no host call and no Python: ``TfscaleNodeAllReduce``, the whole
all-reduce of a job on one node (on a 2-core AMD EPYC, horovod's 2-worker ``mlp`` ran 4-5%
faster with it; bench/RESULTS.md), and ``TfscaleNodeReduceScatter`` and
``TfscaleNodeAllGather``, the node phases around the cross-node sum of a job on several.

The library is compiled once per TensorFlow version, source (its bytes, wherever it lies:
checkouts and installs share one build) and kind of CPU, with the compiler that built Horovod
(``$CXX``, else ``g++``), the flags ``tf.sysconfig`` gives and ``-march=native``, into
``$XDG_CACHE_HOME/tfscale/native`` (``~/.cache``), under a lock, so the processes of a job
starting together build it once. ``-march=native`` lets the sums and the sharded update use
the CPU's widest vectors: on a Zen 5 EPYC (AVX-512) the sharded update of ``mlp``'s gradients
took 0.45 ms less a step than with the compiler's baseline SSE2 (``bench.sharded_update``,
bench/RESULTS.md). Since such a build may not run on an older CPU, the key also holds this
CPU's model and instruction-set flags (:func:`cpu_kind`): nodes of different CPUs that share a
home directory each build their own. ``-ffp-contract=off`` keeps every multiply and add
rounded on its own (no fused multiply-add), as the Python exchange and TensorFlow's update
kernel compute them. AVX512-FP16 alone is left off where ``-march=native`` would turn it on
(TensorFlow's Eigen headers do not compile with it; :func:`_without_fp16_vectors`).
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
    return [compiler, "-O3", "-march=native", *_without_fp16_vectors(compiler), "-shared",
            "-fPIC", "-ffp-contract=off", "-w", str(source or SOURCE),
            "-o", str(output), *tf.sysconfig.get_compile_flags(), *tf.sysconfig.get_link_flags()]


@functools.cache
def _without_fp16_vectors(compiler: str) -> tuple[str, ...]:
    """``-mno-avx512fp16`` where the compiler's ``-march=native`` turns on AVX512-FP16 (Intel
    Xeons from Sapphire Rapids on): TensorFlow's bundled Eigen then compiles its FP16 packet
    code, which does not compile with TensorFlow 2.21's headers (``predux_half_dowto4``, g++
    12), and TensorFlow's own binary is built without it. The op sums no half-precision values,
    so nothing it does loses a vector. Nothing is added where the compiler cannot be asked."""
    try:
        done = subprocess.run([compiler, "-march=native", "-dM", "-E", "-x", "c++", os.devnull],
                              capture_output=True, text=True, timeout=60, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return ("-mno-avx512fp16",) if "__AVX512FP16__" in done.stdout.split() else ()


def library_path() -> Path:
    """Where this TensorFlow's build of the op is (or will be) kept."""
    import tensorflow as tf

    key = hashlib.sha256()
    key.update(SOURCE.read_bytes())
    key.update(tf.__version__.encode())
    key.update(" ".join(_command(Path("out"), Path(SOURCE.name))).encode())
    key.update(cpu_kind().encode())
    return cache_dir() / f"node_all_reduce-{key.hexdigest()[:16]}.so"


def cpu_kind(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """This CPU's vendor, family, model and instruction-set flags (the first processor's lines
    of ``cpuinfo``): what a ``-march=native`` build may use. "" where it cannot be read."""
    try:
        text = cpuinfo.read_text()
    except OSError:
        return ""
    wanted = ("vendor_id", "cpu family", "model", "model name", "flags")
    found: dict[str, str] = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        name = name.strip()
        if name in wanted and name not in found:
            found[name] = value.strip()
        if not line.strip() and found:
            break  # the first processor's block is enough
    return "\n".join(f"{name}: {found.get(name, '')}" for name in wanted)


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


