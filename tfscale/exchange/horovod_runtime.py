"""Horovod's process group and its collectives on values and Keras 3 variables.

The functions follow ``horovod.tensorflow.keras`` (same names, arguments and results); they
call Horovod's TensorFlow ops, which work under Keras 3, and differ from them only where
Keras 3 objects need it: Keras variables are broadcast through their ``.value`` (a
``tf.Variable``). :class:`HorovodCollectives` offers the same operations on small float64
vectors with string ops, for tfscale's strategies and callbacks.

Horovod, TensorFlow and Keras are imported on first use, so importing this module loads none
of them.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
from collections.abc import Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from tfscale.exchange.topology import Topology

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

INSTALL_HINT = (
    "Horovod is not importable in this environment. Build Horovod 0.28.1 with TensorFlow and "
    "Gloo from a tfscale checkout: `bash launch/setup.sh` for the checkout's .venv, or "
    "`launch/build_horovod.sh /path/to/python` for another environment that has TensorFlow "
    "(see BUILD.md); or pick --strategy default|mirrored|multiworker."
)
_OPS = ("mean", "sum", "max", "min")


def check_installed() -> importlib.machinery.ModuleSpec:
    """Raises RuntimeError (:data:`INSTALL_HINT`) unless Horovod is installed with its
    TensorFlow ops, without importing them or TensorFlow: a launcher checks this before it
    starts workers, which import both (:func:`import_horovod`). Returns the spec of
    ``horovod.tensorflow`` (not imported)."""
    try:
        spec = importlib.util.find_spec("horovod.tensorflow")  # imports only horovod/__init__
    except ImportError as err:  # not installed, or its __init__ fails
        raise RuntimeError(f"{INSTALL_HINT} ({err})") from None
    folders = (spec.submodule_search_locations or []) if spec else []
    ops = [os.path.join(folder, f"mpi_lib{suffix}") for folder in folders
           for suffix in importlib.machinery.EXTENSION_SUFFIXES]
    if spec is None or spec.origin is None or not any(os.path.exists(path) for path in ops):
        raise RuntimeError(f"{INSTALL_HINT} (Horovod is installed without its TensorFlow ops: "
                           "no horovod/tensorflow/mpi_lib)")
    return spec


def ops_library() -> Any:
    """Horovod's TensorFlow ops library as a ``horovod.common.basics.HorovodBasics`` (its
    ``mpi_built()``, ``gloo_built()``, ``nccl_built()`` ...), loaded without importing
    TensorFlow or ``horovod.tensorflow``.

    The library links TensorFlow's two shared libraries, which an import of TensorFlow would
    load; here ctypes loads them from TensorFlow's package folder, and then the library. A
    process that asks :func:`built` this way takes 0.68 s of CPU, one that imports
    ``horovod.tensorflow`` to ask 4.32 s (medians, AMD EPYC Zen 4, 2026-12-03; BUILD.md): job
    scripts' pre-flight check and ``horovodrun``'s start-up probes (patched by
    ``launch/build_horovod.sh``) ask only whether the library was built with MPI or Gloo.
    Where the library needs other shared libraries than those two (another TensorFlow build),
    it returns ``horovod.tensorflow`` itself, imported, which answers the same questions.
    Raises RuntimeError (:data:`INSTALL_HINT`) when Horovod is not installed or does not
    import."""
    spec = check_installed()
    import ctypes
    import glob

    from horovod.common.basics import HorovodBasics

    tensorflow = importlib.util.find_spec("tensorflow")
    folders = (tensorflow.submodule_search_locations or []) if tensorflow else []
    libraries = [path for folder in folders for name in ("framework", "cc")
                 for path in sorted(glob.glob(os.path.join(folder, f"libtensorflow_{name}.so*")))]
    try:
        for path in libraries:
            ctypes.CDLL(path, mode=ctypes.RTLD_GLOBAL)
        return HorovodBasics(spec.origin, "mpi_lib")
    except OSError:  # a library it links is not among those: load them as Horovod does
        return import_horovod()


def built(controller: str) -> bool:
    """Whether Horovod's TensorFlow ops were built with ``controller`` (``"mpi"``, ``"gloo"``,
    ``"nccl"``, ...), as ``horovod.tensorflow.<controller>_built()`` answers, without importing
    TensorFlow (:func:`ops_library`)."""
    return bool(getattr(ops_library(), f"{controller}_built")())


def import_horovod() -> ModuleType:
    """``horovod.tensorflow``, or a RuntimeError that says how to install it."""
    try:
        import horovod.tensorflow as hvd
    except ImportError as err:
        raise RuntimeError(f"{INSTALL_HINT} ({err})") from None
    return hvd


def init(*args: Any, **kwargs: Any) -> None:
    """Starts Horovod (``horovod.tensorflow.init``'s arguments, e.g. ``process_sets``)."""
    import_horovod().init(*args, **kwargs)


def shutdown() -> None:
    """Stops Horovod's background thread; collectives fail after it."""
    import_horovod().shutdown()


def is_initialized() -> bool:
    return bool(import_horovod().is_initialized())


def rank() -> int:
    """This process's global rank (0 is the chief)."""
    return int(import_horovod().rank())


def size() -> int:
    """Number of Horovod processes."""
    return int(import_horovod().size())


def local_rank() -> int:
    """This process's index on its node (pick the GPU with it)."""
    return int(import_horovod().local_rank())


def local_size() -> int:
    """Number of Horovod processes on this node."""
    return int(import_horovod().local_size())


def cross_rank() -> int:
    """Index of this process's node."""
    return int(import_horovod().cross_rank())


def cross_size() -> int:
    """Number of nodes."""
    return int(import_horovod().cross_size())


def _process_set(process_set: Any) -> Any:
    return import_horovod().global_process_set if process_set is None else process_set


def allreduce(value: Any, name: str | None = None, average: bool | None = None,
              prescale_factor: float = 1.0, postscale_factor: float = 1.0, op: Any = None,
              compression: Any = None, process_set: Any = None) -> tf.Tensor:
    """Reduces ``value`` (an array, number or tensor) over all processes; ``op`` defaults to
    ``Average``, as in Horovod. Returns a tensor of ``value``'s dtype."""
    import tensorflow as tf

    hvd = import_horovod()
    return hvd.allreduce(tf.convert_to_tensor(value), average=average, op=op, name=name,
                         prescale_factor=prescale_factor, postscale_factor=postscale_factor,
                         compression=compression or hvd.Compression.none,
                         process_set=_process_set(process_set))


def allgather(value: Any, name: str | None = None, process_set: Any = None) -> tf.Tensor:
    """Concatenates every process's ``value`` along the first dimension, in rank order."""
    import tensorflow as tf

    return import_horovod().allgather(tf.convert_to_tensor(value), name=name,
                                      process_set=_process_set(process_set))


def broadcast(value: Any, root_rank: int, name: str | None = None,
              process_set: Any = None) -> tf.Tensor:
    """``root_rank``'s ``value`` on every process."""
    import tensorflow as tf

    return import_horovod().broadcast(tf.convert_to_tensor(value), root_rank, name=name,
                                      process_set=_process_set(process_set))


def broadcast_variables(variables: Sequence[Any], root_rank: int, process_set: Any = None,
                        inplace: bool = False) -> None:
    """Overwrites ``variables`` (Keras 3 variables or ``tf.Variable``s) with ``root_rank``'s
    values. Horovod's own function accepts only ``tf.Variable``s; a Keras 3 variable holds
    one in ``.value``."""
    import keras

    tf_variables = [v.value if isinstance(v, keras.Variable) else v for v in variables]
    import_horovod().broadcast_variables(tf_variables, root_rank,
                                         process_set=_process_set(process_set), inplace=inplace)


class HorovodCollectives:
    """Horovod collectives on small host values and Keras 3 variables.

    Used by the ``horovod`` and ``ddl`` strategies and, with no tfscale config at all, by the
    callbacks in a user's own ``model.fit`` script. Initialises Horovod if needed.
    """

    def __init__(self, process_set: Any = None) -> None:
        self.hvd = import_horovod()
        if not self.hvd.is_initialized():
            self.hvd.init()
        self.process_set = _process_set(process_set)
        self._calls = 0

    @property
    def rank(self) -> int:
        return int(self.hvd.rank())

    @property
    def size(self) -> int:
        return int(self.hvd.size())

    def _name(self, kind: str) -> str:
        # Horovod matches tensors across ranks by name; every rank makes the same calls in the
        # same order, so a counter gives matching, never-colliding names.
        self._calls += 1
        return f"tfscale.{kind}.{self._calls}"

    def all_reduce(self, values: Sequence[float] | np.ndarray, op: str = "mean") -> np.ndarray:
        if op not in _OPS:
            raise ValueError(f"all_reduce op {op!r}; expected one of {_OPS}")
        hvd_op = {"mean": self.hvd.Average, "sum": self.hvd.Sum,
                  "max": self.hvd.Max, "min": self.hvd.Min}[op]
        out = allreduce(np.asarray(values, dtype=np.float64), op=hvd_op,
                        name=self._name("allreduce"), process_set=self.process_set)
        return np.asarray(out.numpy(), dtype=np.float64)

    def broadcast(self, values: Sequence[float] | np.ndarray, root: int = 0) -> np.ndarray:
        out = broadcast(np.asarray(values, dtype=np.float64), root, name=self._name("broadcast"),
                        process_set=self.process_set)
        return np.asarray(out.numpy(), dtype=np.float64)

    def broadcast_variables(self, variables: Sequence[keras.Variable], root: int = 0) -> None:
        broadcast_variables(variables, root, process_set=self.process_set)


DYNAMIC_SETS_HINT = (
    "several nodes of several processes need Horovod process sets registered after start-up: "
    "initialise Horovod with hvd.init(process_sets='dynamic') (or leave it to "
    "HierarchicalAllReduce.create / --strategy=ddl)"
)


def start_horovod() -> ModuleType:
    """``horovod.tensorflow``, initialised with dynamic process sets unless already running."""
    hvd = import_horovod()
    if not hvd.is_initialized():
        hvd.init(process_sets="dynamic")
    return hvd


def discover_topology(hvd: ModuleType, local_size: int = 0) -> Topology:
    """The job's nodes: ``rank // local_size`` when ``local_size`` is given, else Horovod's
    cross and local ranks gathered from every process (a collective: all must call it)."""
    if local_size:
        return Topology.regular(int(hvd.size()), local_size, int(hvd.rank()))
    import tensorflow as tf

    mine = tf.constant([[hvd.cross_rank(), hvd.local_rank()]], dtype=tf.int32)
    table = hvd.allgather(mine, name="tfscale.ddl.topology").numpy()
    return Topology.from_placement([(int(n), int(j)) for n, j in table], int(hvd.rank()))


def register_process_sets(hvd: ModuleType, topology: Topology) -> tuple[Any, Any]:
    """Horovod process sets for the node phases and the cross-node phase of this process, or
    None for a phase that is skipped.

    Every process registers every node's and every local index's set, in the same order
    (Horovod requires identical registration everywhere). A group that spans the whole job is
    Horovod's global set, which needs no registration.

    Raises:
        RuntimeError: if sets must be registered but Horovod was started without dynamic sets.
    """
    local, nodes = topology.local_size, topology.num_nodes
    if local == 1 or nodes == 1:
        whole = hvd.global_process_set
        return (whole if local > 1 else None), (whole if nodes > 1 else None)
    if os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS") != "1":
        raise RuntimeError(f"{topology.describe()}: {DYNAMIC_SETS_HINT}")
    node_sets = [hvd.add_process_set(list(node)) for node in topology.nodes]
    cross_sets = [hvd.add_process_set([node[j] for node in topology.nodes])
                  for j in range(local)]
    return node_sets[topology.node_index], cross_sets[topology.local_index]


def horovod_transport(hvd: ModuleType) -> str:
    """What carries Horovod's collectives in this job: "Horovod (MPI)" or "Horovod (Gloo)"."""
    mpi = getattr(hvd, "mpi_enabled", lambda: False)()
    return "Horovod (MPI)" if mpi else "Horovod (Gloo)"
