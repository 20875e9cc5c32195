"""Topology-aware all-reduce (the scheme that made IBM DDL fast) on Horovod process sets.

``p`` processes on ``C`` nodes of ``L`` processes each sum a buffer of ``n`` values in three
phases:

1. reduce-scatter inside each node: the process with local index ``j`` receives the node's sum of
   chunk ``j`` (``n / L`` values);
2. all-reduce across nodes among the processes with the same local index: chunk ``j`` summed
   over the whole job;
3. all-gather inside each node: every process gets all ``L`` summed chunks.

Only phase 2 crosses the network, and each process sends ``n / L`` values over it instead of
``n``; phases 1 and 3 use the fast links inside a node. Phases whose group has one process are
skipped (one node: no phase 2; one process per node: phases 1 and 3).

Phases 1 and 3 run through Horovod's collectives on the node's process set, or, on CPU-only
x86-64 nodes, through a shared-memory segment (:mod:`tfscale.exchange.shared_memory`: a few
memory copies instead of Gloo's TCP over loopback). For Horovod's collectives the tensors of
one call are fused first, one flat buffer per dtype padded to a multiple of ``L``, so each phase
is one collective per dtype, and the result is split back to the original shapes; the
shared-memory segment takes the tensors as they are.

Nodes come from Horovod's ``cross_rank``/``local_rank`` (the launcher's host list: horovodrun's
``-H``, ``HOROVOD_HOSTNAME``, MPI's shared-memory split), or from an explicit ``local_size``
that regroups ranks as ``rank // local_size`` (to simulate nodes, or when the host list does
not match the network).
"""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

import numpy as np

from tfscale.exchange import native, placement, shared_memory
from tfscale.exchange.fusion import fuse, unfuse
from tfscale.exchange.horovod_runtime import (
    discover_topology,
    horovod_transport,
    register_process_sets,
    start_horovod,
)
from tfscale.exchange.interface import check_op, reduce_rows
from tfscale.exchange.topology import Topology


def open_shared_memory(hvd: ModuleType, topology: Topology, mode: str = "auto",
                       timeout_s: float = 0.0,
                       ) -> tuple[shared_memory.SharedMemoryGroup | None, placement.ExchangePlan]:
    """The shared-memory exchange of this process's node, or None where the node phases stay
    on Horovod, with the plan that says so (:func:`placement.plan_exchange`). A collective:
    every process must call it.

    Args:
        mode: "auto", "shared_memory" or "collectives" (``--node_exchange``).
        timeout_s: how long a process waits for the others of its node (0: 600 s).

    Raises:
        ValueError: for "shared_memory" where it cannot work, saying why.
    """
    import tensorflow as tf

    # Every process takes part in the token's broadcast and the domains' gathering, whatever
    # it decides, so the job's collectives stay matched.
    token = int(hvd.broadcast(tf.constant([new_token()], tf.int64),
                              root_rank=0, name="tfscale.ddl.node_exchange").numpy()[0])
    domains = placement.gather_strings(
        placement.shm_domain(), topology.rank, topology.size,
        lambda v: hvd.allreduce(tf.constant(v), op=hvd.Sum,
                                name="tfscale.ddl.shm_domains").numpy())
    plan = placement.plan_exchange(mode, topology.nodes, domains, horovod_transport(hvd))
    return shared_memory_group(token, topology, plan, timeout_s), plan


def shared_memory_group(token: int, topology: Topology, plan: placement.ExchangePlan,
                        timeout_s: float = 0.0) -> shared_memory.SharedMemoryGroup | None:
    """:func:`open_shared_memory` once the job agrees on ``token`` (rank 0's
    :func:`new_token`) and the ``plan``, for strategies that reach them with their own
    collectives. Not a collective
    itself."""
    if not plan.shared_memory:
        return None
    return shared_memory.SharedMemoryGroup(f"{token:012x}-node{topology.node_index}",
                                      topology.local_index, topology.local_size,
                                      timeout_s or 600.0, ranks=topology.node_ranks)


def new_token() -> int:
    """A random 48-bit number: rank 0's names the job's shared-memory segments (exact in a
    float64 too, for collectives that carry only floats)."""
    return int.from_bytes(os.urandom(6), "little")


@dataclasses.dataclass
class HierarchicalAllReduce:
    """Sums or averages lists of tensors over all processes in the three phases above.

    Calling it averages (the gradient reduction of the ``ddl`` strategy; pass it to
    :func:`tfscale.exchange.optimizer.with_gradient_reduction`); :meth:`sum` sums.
    Build one per Horovod session with :meth:`create` (it registers the process sets); copies
    made with ``dataclasses.replace`` share the sets.

    With several nodes of several processes the last phase runs inside a node, so one node can
    finish a step before another: run a global collective (``DDLMetricSync`` at the end of the
    epoch does; so does any flat all-reduce) before Horovod shuts down, or the node that shuts
    down first aborts the other's exchange.

    Attributes:
        hvd: ``horovod.tensorflow``; None for a job on one node that exchanges only through
            shared memory (:meth:`on_one_node`).
        topology: the node layout.
        node_set: process set of this node (phases 1 and 3), None when they are skipped.
        cross_set: process set across nodes (phase 2), None when it is skipped.
        compression: exchange floating-point buffers as float16.
        name: prefix of the Horovod tensor names (they must match across processes).
        node: the shared-memory exchange of phases 1 and 3, or None for Horovod's.
        plan: what carries each phase (:func:`placement.plan_exchange`), for the logs.
        cross_sum: phase 2 without Horovod, with the shared-memory node phases: a function
            of (this process's summed chunk, a tag naming the call site) that sums the chunk
            over the processes with this local index, one per node (a ``tf.distribute``
            cluster's ring over TCP: :func:`tfscale.exchange.cross_node.cross_node_sum`).
        transient: with shared memory, return views of its buffers instead of copies. Such a
            result is overwritten two calls later, so only for tensors used up within the
            step that made them: gradients applied by the optimizer (the ``ddl`` strategy's
            gradient reduction sets it). Saves a copy of every gradient per step.
    """

    hvd: ModuleType | None
    topology: Topology
    node_set: Any
    cross_set: Any
    compression: bool = False
    name: str = "tfscale.ddl"
    node: shared_memory.SharedMemoryGroup | None = None
    transient: bool = False
    plan: placement.ExchangePlan | None = None
    cross_sum: Callable[[Any, str], Any] | None = None

    @classmethod
    def create(cls, local_size: int = 0, compression: bool = False,
               node_exchange_mode: str = "auto", timeout_s: float = 0.0,
               ) -> HierarchicalAllReduce:
        """Starts Horovod if needed, finds the nodes, registers the process sets and sets up
        the shared-memory node exchange (every process must call it, in the same order
        relative to other collectives).

        Args:
            local_size: processes per node, overriding the launcher's hosts (0: use them).
            compression: exchange floating-point buffers as float16.
            node_exchange_mode: how phases 1 and 3 run (:func:`open_shared_memory`).
            timeout_s: for the shared-memory exchange, how long to wait for the node's other
                processes (0: 600 s).
        """
        hvd = start_horovod()
        topology = discover_topology(hvd, local_size)
        node_set, cross_set = register_process_sets(hvd, topology)
        node, plan = open_shared_memory(hvd, topology, node_exchange_mode, timeout_s)
        return cls(hvd, topology, node_set, cross_set, compression, node=node, plan=plan)

    @classmethod
    def on_one_node(cls, node: shared_memory.SharedMemoryGroup, compression: bool = False,
                    name: str = "tfscale.node", transient: bool = False,
                    plan: placement.ExchangePlan | None = None) -> HierarchicalAllReduce:
        """The all-reduce of a job whose processes all run on one node, wholly through the
        shared-memory exchange ``node`` (no Horovod): phase 2 has nothing to do there. The
        ``horovod`` and ``multiworker`` strategies use it on CPU nodes."""
        topology = Topology.regular(node.size, node.size, node.index)
        return cls(None, topology, None, None, compression, name, node, transient, plan)

    @classmethod
    def with_cross_sum(cls, node: shared_memory.SharedMemoryGroup, topology: Topology,
                       cross_sum: Callable[[Any, str], Any], name: str,
                       plan: placement.ExchangePlan | None = None) -> HierarchicalAllReduce:
        """Phases 1 and 3 through the shared-memory exchange ``node``, phase 2 through
        ``cross_sum`` (no Horovod): the ``multiworker`` strategy across nodes."""
        return cls(None, topology, None, None, False, name, node, plan=plan,
                   cross_sum=cross_sum)

    @property
    def node_transport(self) -> str:
        """What carries phases 1 and 3: "shared memory", "Horovod collectives" or "" (skipped)."""
        if self.node is not None:
            return "shared memory"
        return "" if self.node_set is None else "Horovod collectives"

    @property
    def one_node_shared_memory(self) -> bool:
        """The whole job is one node, whose processes exchange through shared memory."""
        return self.node is not None and self.topology.num_nodes == 1

    def host_all_reduce(self, values: Sequence[float] | np.ndarray,
                        op: str = "mean") -> np.ndarray | None:
        """``op`` over every process's host ``values`` (a few numbers: stop flags, logs,
        evaluation sums) through the shared-memory segment, when the whole job is this one
        node; None otherwise, for the caller's own transport. Every process gets the same
        result: each reduces the same gathered rows in the same order."""
        if self.node is None or not self.one_node_shared_memory:
            return None
        check_op(op)
        return reduce_rows(self.node.gather(np.asarray(values, np.float64).reshape(-1)), op)

    def __call__(self, tensors: Sequence[Any]) -> list[Any]:
        """The element-wise means of ``tensors`` over all processes."""
        return self._reduce(tensors, average=True)

    def sum(self, tensors: Sequence[Any]) -> list[Any]:
        """The element-wise sums of ``tensors`` over all processes."""
        return self._reduce(tensors, average=False)

    def _reduce(self, tensors: Sequence[Any], average: bool) -> list[Any]:
        import tensorflow as tf

        values = [tf.convert_to_tensor(t) for t in tensors]
        if self.topology.size == 1:
            # One process: the sum and the mean are the values; fusing them into a buffer
            # and out again would only copy every gradient twice per step.
            return values
        by_dtype: dict[Any, list[int]] = {}
        for i, v in enumerate(values):
            by_dtype.setdefault(v.dtype, []).append(i)
        out: list[Any] = [None] * len(values)
        for dtype, indices in by_dtype.items():
            group = [values[i] for i in indices]
            if self.node is not None:
                for i, v in zip(indices, self._reduce_on_node(group, average), strict=True):
                    out[i] = v
                continue
            buffer = self._reduce_buffer(fuse(group, self.topology.local_size), dtype.name)
            if average:
                buffer = buffer / tf.cast(self.topology.size, dtype)
            for i, v in zip(indices, unfuse(buffer, group), strict=True):
                out[i] = v
        return out

    def _reduce_buffer(self, buffer: Any, tag: str) -> Any:
        import tensorflow as tf

        hvd, dtype, length = self.hvd, buffer.dtype, buffer.shape[0]
        assert hvd is not None, "without Horovod, only the shared-memory exchange runs"
        if self.compression and dtype.is_floating:
            buffer = tf.cast(buffer, tf.float16)
        name = f"{self.name}.{tag}"
        if self.node_set is not None:
            buffer = hvd.reducescatter(buffer, op=hvd.Sum, name=f"{name}.reducescatter",
                                       process_set=self.node_set)
        if self.cross_set is not None:
            buffer = hvd.allreduce(buffer, op=hvd.Sum, name=f"{name}.allreduce",
                                   process_set=self.cross_set)
        if self.node_set is not None:
            buffer = hvd.allgather(buffer, name=f"{name}.allgather", process_set=self.node_set)
        return tf.ensure_shape(tf.cast(buffer, dtype), [length])

    def _reduce_on_node(self, tensors: Sequence[Any], average: bool) -> list[Any]:
        """Phases 1 to 3 for ``tensors`` of one dtype, the node phases in shared memory: the
        tensors go to the node's segment as they are (no fused buffer). The segment adds in
        their own dtype, and ``compression`` applies to the cross-node phase only: nothing
        crosses a network inside a node, and NumPy's float16 additions are slow (the 2 x 2
        mlp at 1 Gbit/s ran at 0.7 x its float32 speed when the node phases were float16)."""
        import tensorflow as tf

        node, dtype = self.node, tensors[0].dtype
        assert node is not None
        values = list(tensors)
        divisor = self.topology.size if average else 1
        copy = not self.transient
        name = f"{self.name}.{dtype.name}".replace(".", "_")
        if self.cross_set is None and self.cross_sum is None:
            outs = native_all_reduce(node, values, divisor, copy, f"{name}_node_allreduce")
            if outs is None:
                outs = tf.numpy_function(functools.partial(node.all_reduce, divisor=divisor,
                                                           copy=copy),
                                         values, [dtype] * len(values), stateful=True,
                                         name=f"{name}_node_allreduce")
        else:
            # Both node phases as ops, or both in tf.numpy_function (the Python pair keeps
            # the segment of its reduce_scatter for its all_gather).
            native_phases = native_node_phases(node, values, f"{name}_node")
            if native_phases is not None:
                chunk = native_phases.reduce_scatter()
            else:
                chunk = tf.numpy_function(node.reduce_scatter, values, dtype, stateful=True,
                                          name=f"{name}_node_reducescatter")
            wire = tf.float16 if self.compression and dtype.is_floating else dtype
            chunk = tf.cast(chunk, wire)
            if self.cross_sum is not None:
                chunk = self.cross_sum(chunk, f"{self.name}.{dtype.name}.allreduce")
            else:
                assert self.hvd is not None, "a cross-node phase runs on Horovod"
                chunk = self.hvd.allreduce(chunk, op=self.hvd.Sum,
                                           name=f"{self.name}.{dtype.name}.allreduce",
                                           process_set=self.cross_set)
            if native_phases is not None:
                outs = native_phases.all_gather(tf.cast(chunk, dtype), divisor, copy)
            else:
                outs = tf.numpy_function(functools.partial(node.all_gather, divisor=divisor,
                                                           copy=copy),
                                         [tf.cast(chunk, dtype)], [dtype] * len(values),
                                         stateful=True, name=f"{name}_node_allgather")
        # (numpy_function gives a lone tensor, not a list, for a list of one output.)
        return [tf.ensure_shape(o, t.shape)
                for o, t in zip(tf.nest.flatten(outs), tensors, strict=True)]


def native_segment(node: shared_memory.SharedMemoryGroup, values: Sequence[Any],
                   owner: str = "") -> tuple[Any, shared_memory.Segment] | None:
    """(op library, segment) for :mod:`tfscale.exchange.native`'s ops on ``values`` (tensors of
    one dtype); None where the ops cannot run them (one process, a dtype other than float32 and
    float64, a shape not known when traced, or no op library), for ``tf.numpy_function`` to
    run the same exchange. The segment is made when the step is traced, which every process
    of the node does. ``owner``: a segment of its own (:meth:`SharedMemoryGroup.segment`)."""
    import tensorflow as tf

    dtype = values[0].dtype
    if (node.size < 2 or dtype not in (tf.float32, tf.float64)
            or not all(v.shape.is_fully_defined() for v in values)):
        return None
    library = native.library()
    if library is None:
        return None
    return library, node.segment(np.dtype(dtype.as_numpy_dtype),
                                 tuple(tuple(v.shape) for v in values), owner)


def segment_attrs(node: shared_memory.SharedMemoryGroup,
                   segment: shared_memory.Segment) -> dict[str, Any]:
    """The attrs that place an op of :mod:`tfscale.exchange.native` on ``segment``."""
    return {"address": segment.address, "offsets": list(segment.offsets),
            "length": segment.length, "index": node.index, "size": node.size,
            "ranks": list(node.ranks), "timeout_s": node.timeout_s}


def native_all_reduce(node: shared_memory.SharedMemoryGroup, values: Sequence[Any],
                      divisor: int, copy: bool, name: str) -> list[Any] | None:
    """The node's all-reduce of ``values`` (tensors of one dtype) as
    :mod:`tfscale.exchange.native`'s op, on the segment that the Python calls would use; None
    where the op cannot run it (:func:`native_segment`)."""
    found = native_segment(node, values)
    if found is None:
        return None
    library, segment = found
    outs: list[Any] = library.tfscale_node_all_reduce(
        values, divisor=divisor, views=not copy, name=name, **segment_attrs(node, segment))
    return outs


@dataclasses.dataclass(frozen=True)
class NativeNodePhases:
    """Phases 1 and 3 of one hierarchical all-reduce of ``values`` as
    :mod:`tfscale.exchange.native`'s ops: :meth:`reduce_scatter` gives this process's chunk of
    the node's sum; :meth:`all_gather` takes that chunk's cross-node sum and gives the
    tensors. The same steps, segment and additions as the node's Python
    ``reduce_scatter``/``all_gather``, with no host call."""

    library: Any
    attrs: dict[str, Any]
    values: tuple[Any, ...]
    name: str

    def reduce_scatter(self) -> Any:
        return self.library.tfscale_node_reduce_scatter(
            list(self.values), name=f"{self.name}_reducescatter", **self.attrs)

    def all_gather(self, chunk: Any, divisor: int, copy: bool) -> list[Any]:
        outs: list[Any] = self.library.tfscale_node_all_gather(
            chunk, N=len(self.values), shapes=[v.shape for v in self.values], divisor=divisor,
            views=not copy, name=f"{self.name}_allgather", **self.attrs)
        return outs


def native_node_phases(node: shared_memory.SharedMemoryGroup, values: Sequence[Any],
                       name: str) -> NativeNodePhases | None:
    """:class:`NativeNodePhases` for ``values``, or None where the ops cannot run them
    (:func:`native_segment`)."""
    found = native_segment(node, values)
    if found is None:
        return None
    library, segment = found
    return NativeNodePhases(library, segment_attrs(node, segment), tuple(values), name)
