"""SGD's momentum update sharded over the processes of a node (ZeRO's stage 1, inside a node).

Each process of a one-node job used to sum its chunk of the gradients, read every other chunk's
sum back from the segment and apply the whole update to every weight, as every other process
did too: ``p`` identical updates of the whole model per step. Here one op
(``TfscaleNodeAllReduceMomentum``, :mod:`tfscale.exchange.native`) sums this process's chunk,
applies Keras' momentum update to that chunk of the weights and of the momentum (the same
arithmetic as ``ResourceApplyKerasMomentum``, element by element) and writes the chunk's new
weights to the segment's weights region. The variables keep their weights in that region:
after the first step each variable's buffer is its place there, so every process's variables
hold the node's one copy of the weights, each process updates its chunk in place, and nothing
is copied back (a variable whose buffer was replaced since, by an assign or a copy made for a
reader, is bound again at the end of the step). Each optimizer has a segment of its own, so
two models never share a weights region (the op refuses a variable whose place another holds,
before it writes anything). Every process ends the step with the same weights, bit for bit,
having read the sums of and updated ``1 / p`` of them. TensorFlow never
writes into the region itself: it does not count that memory as the variable's own, so
assigns and in-place ops give the variable a buffer of its own first.

The momentum is the state that is sharded: a process's momentum variables are up to date in
its own chunk only. :func:`gather_momentum` (a collective) brings the other chunks in; the
checkpoint callback calls it before every save, so checkpoints hold the whole momentum and
resume on any number of workers. Anything else that reads the optimizer's momentum between
steps must call it first, which is why only ``tfscale.train``'s strategies shard the update
(``--sharded_update``), not the Keras glue of users' own scripts.

It applies to Keras' ``SGD`` with momentum (``tfscale.training.optimizers.sgd.SGD`` fuses the
same update) and nothing between the gradients and the update: no clipping, weight decay,
moving average of the weights, gradient accumulation or loss scaling, each of which needs
every gradient or weight; and to dense float32 or float64 gradients exchanged wholly through
one node's shared-memory segment by the native op. Elsewhere the update is unsharded, as
before; so it is where ``/dev/shm`` has no room for the weights region (one line says so).
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING, Any

import numpy as np

from tfscale.cluster import rank_zero
from tfscale.config.options import Option
from tfscale.exchange import native, timing
from tfscale.exchange.shared_memory import SharedMemoryFull

if TYPE_CHECKING:
    import keras

    from tfscale.exchange.hierarchical import HierarchicalAllReduce

SHARDED_UPDATE = Option(
    "sharded_update", True,
    "horovod, multiworker: where every worker runs on one node and the gradients go through "
    "its shared memory, each worker applies SGD's momentum update to its own share of the "
    "weights and takes the others' new weights from the segment (ZeRO stage 1 inside a node: "
    "the same weights, bit for bit, for a fraction of the update's work). Keras' SGD with "
    "momentum only, with no clipping, weight decay, EMA, loss scaling or --gradient_lag; "
    "elsewhere every worker applies the whole update.", tuning=True)

# Optimizer attributes that, when set, put work between the gradients and the update.
_IN_BETWEEN = ("clipnorm", "clipvalue", "global_clipnorm", "weight_decay",
               "gradient_accumulation_steps", "loss_scale_factor")


def why_not_optimizer(optimizer: keras.optimizers.Optimizer) -> str:
    """Why ``optimizer``'s update cannot be sharded, or "" if it can: Keras' SGD momentum
    update (Keras' own ``SGD`` or one whose ``update_step`` says it computes the same,
    ``keras_momentum_update``), with momentum, and nothing in between."""
    import keras

    if hasattr(optimizer, "inner_optimizer"):
        return "a LossScaleOptimizer checks every gradient before the update"
    if not isinstance(optimizer, keras.optimizers.SGD):
        return f"{type(optimizer).__name__} is not SGD"
    update = type(optimizer).update_step
    if not (update is keras.optimizers.SGD.update_step
            or getattr(update, "keras_momentum_update", False)):
        return f"{type(optimizer).__name__} has its own update_step"
    if not optimizer.momentum:
        return "SGD without momentum has no state to shard"
    if optimizer.use_ema:
        return "use_ema averages every weight"
    for name in _IN_BETWEEN:
        if getattr(optimizer, name, None):
            return f"{name}={getattr(optimizer, name)!r} needs every gradient or weight"
    return ""


def why_not_exchange(reduce: HierarchicalAllReduce | None) -> str:
    """Why the gradients of ``reduce`` cannot take the sharded update, or "" if they can: a
    job on one node of two or more processes, exchanging through shared memory with the
    native op."""
    if reduce is None or reduce.node is None:
        return "the gradients are not exchanged through a node's shared memory"
    if not reduce.one_node_shared_memory:
        return "the job spans several nodes"
    if reduce.topology.size < 2:
        return "one process has nothing to shard"
    if native.library() is None:
        return "the exchange's native op is not available"
    return ""


def choose(enabled: bool, optimizer: keras.optimizers.Optimizer,
           reduce: HierarchicalAllReduce | None) -> tuple[HierarchicalAllReduce | None, str]:
    """(``reduce``, a phrase for the logs) where ``optimizer``'s update is to be sharded over
    ``reduce``'s processes, else (None, "")."""
    if not enabled or why_not_exchange(reduce) or why_not_optimizer(optimizer):
        return None, ""
    assert reduce is not None
    return reduce, f"SGD's momentum update sharded over {reduce.topology.size} processes"


def apply(optimizer: keras.optimizers.Optimizer, reduce: HierarchicalAllReduce,
          grads: list[Any], variables: list[Any], learning_rate: Any,
          divisor: int = 1) -> Any | None:
    """In a traced step: sums ``grads`` (this process's, one per variable, none missing) over
    the node's processes, divided by ``divisor``, and applies ``optimizer``'s momentum update
    with them, sharded; returns the op's output (the exchange's number, once the variables
    hold the new weights), or None where the op cannot take these gradients (sparse, of
    another dtype or of mixed dtypes, a shape not known), for the caller's unsharded update.
    The op's time goes on the exchange clock (:mod:`tfscale.exchange.timing`, when enabled)."""
    import tensorflow as tf

    from tfscale.exchange.hierarchical import native_segment, segment_attrs

    node = reduce.node
    if (node is None or not grads or refused(optimizer)
            or any(isinstance(g, tf.IndexedSlices) or g is None for g in grads)):
        return None
    grads = [tf.convert_to_tensor(g) for g in grads]
    dtype = grads[0].dtype
    if any(g.dtype != dtype for g in grads) or any(v.dtype != dtype for v in variables):
        return None
    # A segment of the optimizer's own: its weights region holds this model's weights. The
    # k-th optimizer that a process shards gets the k-th, as on every process of the node.
    owner = optimizer.__dict__.setdefault("_tfscale_weights_owner", f"weights{next(_OWNERS)}")
    try:
        found = native_segment(node, grads, owner)
    except SharedMemoryFull as err:
        # Every process of the node gets the same error here, so all take the whole update;
        # the plain exchange needs a buffer less, and says so in turn if that too is short.
        optimizer.__dict__["_tfscale_weights_refused"] = True
        rank_zero.log(f"SGD's momentum update not sharded: {err}. Every worker applies the "
                      "whole update.")
        return None
    if found is None:
        return None
    library, segment = found
    momentums = [optimizer.momentums[optimizer._get_variable_index(v)] for v in variables]
    _record(optimizer, segment, momentums)
    name = f"{reduce.name}.{dtype.name}_sharded_momentum".replace(".", "_")
    started = timing.start(grads)
    done = library.tfscale_node_all_reduce_momentum(
        grads, [resource_handle(v) for v in variables],
        [resource_handle(m) for m in momentums], tf.cast(learning_rate, dtype),
        tf.cast(optimizer.momentum, dtype), divisor=divisor,
        use_nesterov=bool(optimizer.nesterov), name=name, **segment_attrs(node, segment))
    timing.stop(started, [done])
    return done


def resource_handle(variable: Any) -> Any:
    """The resource handle of a Keras or TensorFlow variable (under ``tf.distribute``, in a
    replica's context: that replica's copy)."""
    import keras

    if isinstance(variable, keras.Variable):
        variable = variable.value
    return variable.handle


_OWNERS = itertools.count()


def _record(optimizer: Any, segment: Any, momentums: list[Any]) -> None:
    """Keeps, on the optimizer, which momentum variables a traced step shards on which
    segment, for :func:`gather_momentum`."""
    shards = optimizer.__dict__.setdefault("_tfscale_sharded_momentum", {})
    shards[tuple(id(m) for m in momentums)] = (segment, momentums)


def refused(optimizer: keras.optimizers.Optimizer | None) -> bool:
    """Whether ``optimizer``'s update was to be sharded but is not: shared memory had no room
    for its segment's weights region (:func:`apply` said so)."""
    return bool(optimizer is not None and optimizer.__dict__.get("_tfscale_weights_refused"))


def sharded(optimizer: keras.optimizers.Optimizer) -> bool:
    """Whether a traced step of ``optimizer`` shards its momentum."""
    return bool(getattr(optimizer, "_tfscale_sharded_momentum", None))


def gather_momentum(optimizer: keras.optimizers.Optimizer) -> None:
    """Brings every process's chunk of the sharded momentum into this process's momentum
    variables, so that they hold the whole momentum, as an unsharded update would have left
    them; nothing where no step sharded it. A collective: every process of the node calls it
    between the same steps (the checkpoint callback does, before saving)."""
    for segment, momentums in getattr(optimizer, "_tfscale_sharded_momentum", {}).values():
        mine = [own_part(np.asarray(m.numpy()), offset, segment.chunk)
                for m, offset in zip(momentums, segment.offsets, strict=True)]
        # Each element is this process's in one process and zero in the others: adding
        # zeros is exact. On the op's own segment (its buffers, not its weights region).
        segment.reduce_scatter(mine)
        for m, whole in zip(momentums, segment.all_gather(1), strict=True):
            m.assign(whole)


def own_part(values: np.ndarray, offset: int, chunk: slice) -> np.ndarray:
    """``values`` (a tensor laid out at ``offset`` of a segment) where they fall in this
    process's ``chunk`` of the segment, zero elsewhere."""
    flat = values.reshape(-1)
    out = np.zeros_like(flat)
    lo, hi = max(offset, chunk.start), min(offset + flat.size, chunk.stop)
    if lo < hi:
        out[lo - offset:hi - offset] = flat[lo - offset:hi - offset]
    return out.reshape(values.shape)
