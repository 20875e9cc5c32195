"""Activation recomputation: keep only the tensors between blocks, recompute the rest.

:func:`recompute_blocks` makes a functional Keras model run each of its *blocks* (a set of
layers that a rule names, e.g. one ResNet bottleneck or one dense block) under
``tf.recompute_grad``: the forward pass keeps only the block's inputs, and the backward pass
runs the block again, under its own tape, to get the activations its gradients need. A
training step then holds the tensors that cross block boundaries plus one block's
activations at a time, instead of every layer's activations, for about one more forward pass
of compute. Recomputing layer by layer would save nothing: each layer's output is the next
one's input, which is kept anyway.

The model keeps its layers and weights: only the instance's ``call`` is replaced, and only in
training (inference runs Keras's own ``call``). So checkpoints are the same with and without
recomputation, and a model rebuilt from its config is a plain Keras model.

The recomputation must repeat the forward pass exactly and change nothing. Each block runs
in a :class:`keras.StatelessScope` that starts from the values its layers' non-trainable
variables had before the forward pass, both times: dropout draws the same masks (its seed
generator's state is such a variable) and batch normalisation the same statistics, and the
updates they make (seed states, moving mean and variance) are written once, after the
forward pass, never by the recomputation. Layers are called as they are, so instance-level
changes to them (synchronized batch-norm moments, say) hold in both passes.

For a model of your own, name the blocks by layer name::

    model = keras.Model(inputs, outputs)  # layers named "block1_conv", "block1_bn", ...
    model.compile(optimizer, loss)
    recompute_blocks(model, lambda name: name.split("_")[0] if name.startswith("block") else None)
    model.fit(...)

The graph walk follows Keras's own (``Function._run_through_graph`` in keras/src/ops/function.py
and ``Functional.call`` in keras/src/models/functional.py, Keras 3.15), whose private members
it uses.
"""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

BlockRule = Callable[[str], "str | None"]
"""Maps a layer's name to the name of its block, or None for a layer outside every block."""


@dataclasses.dataclass(frozen=True)
class Block:
    """Layers recomputed together: the graph ``nodes`` in execution order, the tensors they
    read from outside (``inputs``), the tensors used outside (``outputs``) and the
    non-trainable variables of their layers (``states``)."""

    name: str
    nodes: tuple[Any, ...]
    inputs: tuple[Any, ...]
    outputs: tuple[Any, ...]
    states: tuple[keras.Variable, ...]


Step = Any  # a keras Node run as it is, or a Block


def recompute_blocks(model: keras.Model, block_of: BlockRule) -> list[Block]:
    """Makes training passes of the functional ``model`` recompute each block's activations
    in the backward pass instead of keeping them.

    Call it once, before anything else replaces ``model.call`` (as XLA compilation of the
    forward pass does); a replaced ``train_step`` (gradient accumulation) is fine. Layers
    outside every block run as usual. Losses added inside a block (activity regularizers)
    are not supported.

    Args:
        model: a functional ``keras.Model`` (built from ``keras.Input``).
        block_of: the rule naming each layer's block (:data:`BlockRule`).

    Returns:
        The blocks, in the order they run.

    Raises:
        ValueError: if ``model`` is not functional or its ``call`` is already replaced, if the
            rule puts no layer in a block, or if a block's layers are not contiguous (a path
            leaves the block and comes back into it).
    """
    import keras

    if not isinstance(model, keras.Model) or not hasattr(model, "_nodes_by_depth"):
        raise ValueError(f"recompute_blocks needs a functional keras.Model; got {model!r}")
    if "call" in vars(model):
        raise ValueError(f"model {model.name!r}: its call is already replaced; apply "
                         "recompute_blocks before anything else wraps it")
    steps = _plan(model, block_of)
    blocks = [s for s in steps if isinstance(s, Block)]
    if not blocks:
        raise ValueError(f"model {model.name!r}: the block rule puts none of its layers in a "
                         "block, so there is nothing to recompute")
    plain_call = model.call

    def call(inputs: Any, training: Any = None, mask: Any = None, **kwargs: Any) -> Any:
        if not training or mask is not None or kwargs:
            return plain_call(inputs, training=training, mask=mask, **kwargs)
        return _run(model, steps, inputs, training)

    # Keras's Layer.__call__ looks call up on the instance.
    model.call = call
    return blocks


def _nodes_in_order(model: keras.Model) -> list[Any]:
    """The model's layer nodes in the order Keras runs them (deepest first)."""
    by_depth = model._nodes_by_depth
    return [node for depth in sorted(by_depth, reverse=True) for node in by_depth[depth]
            if node.operation is not None and not node.is_input]


def _plan(model: keras.Model, block_of: BlockRule) -> list[Step]:
    """The model's nodes grouped into blocks and ordered so that each step's inputs exist."""
    nodes = _nodes_in_order(model)
    position = {id(node): i for i, node in enumerate(nodes)}
    groups: dict[str, list[Any]] = {}
    units: list[tuple[str | None, list[Any]]] = []
    for node in nodes:
        name = block_of(node.operation.name)
        if name is None:
            units.append((None, [node]))
        elif name in groups:
            groups[name].append(node)
        else:
            groups[name] = [node]
            units.append((name, groups[name]))
    unit_of = {id(node): u for u, (_, members) in enumerate(units) for node in members}
    producer = {id(t): unit_of[id(node)] for node in nodes for t in node.outputs}
    needs = [{producer[id(t)] for node in members for t in node.input_tensors
              if id(t) in producer} - {u} for u, (_, members) in enumerate(units)]
    order = _topological(needs, [position[id(members[0])] for _, members in units])
    if len(order) < len(units):
        stuck = sorted({units[u][0] or "" for u in set(range(len(units))) - set(order)} - {""})
        raise ValueError(f"model {model.name!r}: blocks {stuck} are not contiguous (a path "
                         "leaves a block and comes back into it); change the block rule")
    readers: dict[int, set[int]] = {}  # tensor id -> the units reading it
    for u, (_, members) in enumerate(units):
        for node in members:
            for t in node.input_tensors:
                readers.setdefault(id(t), set()).add(u)
    model_outputs = {id(t) for t in model.outputs}
    steps: list[Step] = []
    for u in order:
        name, members = units[u]
        if name is None:
            steps.append(members[0])
            continue
        inside = {id(t) for node in members for t in node.outputs}
        inputs = _unique(t for node in members for t in node.input_tensors
                         if id(t) not in inside)
        outputs = _unique(t for node in members for t in node.outputs
                          if id(t) in model_outputs or readers.get(id(t), set()) - {u})
        states = _unique(v for layer in _unique(n.operation for n in members)
                         for v in layer.non_trainable_variables)
        steps.append(Block(name, tuple(members), tuple(inputs), tuple(outputs), tuple(states)))
    return steps


def _topological(needs: Sequence[set[int]], priority: Sequence[int]) -> list[int]:
    """Kahn's order of units ``0..n-1`` (``needs[u]``: the units ``u`` reads from), lowest
    ``priority`` first among the ready ones; shorter than ``n`` if there is a cycle."""
    waiting = [len(n) for n in needs]
    readers: list[list[int]] = [[] for _ in needs]
    for u, sources in enumerate(needs):
        for s in sources:
            readers[s].append(u)
    ready = [(priority[u], u) for u, count in enumerate(waiting) if count == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        _, u = heapq.heappop(ready)
        order.append(u)
        for r in readers[u]:
            waiting[r] -= 1
            if waiting[r] == 0:
                heapq.heappush(ready, (priority[r], r))
    return order


def _unique(items: Iterable[Any]) -> list[Any]:
    """``items`` without repeats (by identity), in first-seen order."""
    seen: set[int] = set()
    unique = []
    for item in items:
        if id(item) not in seen:
            seen.add(id(item))
            unique.append(item)
    return unique


def _run(model: keras.Model, steps: list[Step], inputs: Any, training: Any) -> Any:
    """The model's forward pass, step by step (Keras's ``Functional.call``)."""
    from keras import tree
    from keras.src.models.functional import unpack_singleton

    flat = tree.flatten(model._standardize_inputs(inputs))
    values = {id(x): y for x, y in zip(model.inputs, flat, strict=True)}
    for step in steps:
        if isinstance(step, Block):
            _run_block(step, values, training)
        else:
            _run_nodes([step], values, training)
    outputs = [values[id(t)] for t in model.outputs]
    return unpack_singleton(tree.pack_sequence_as(model._outputs_struct, outputs))


def _run_nodes(nodes: Sequence[Any], values: dict[int, Any], training: Any) -> None:
    """Runs ``nodes`` in order, reading their inputs from and writing their outputs to
    ``values`` (tensors by the id of the graph's KerasTensor)."""
    from keras import tree
    from keras.src.models.functional import operation_fn

    for node in nodes:
        args, kwargs = node.arguments.fill_in(values)
        outputs = operation_fn(node.operation, training=training)(*args, **kwargs)
        for x, y in zip(node.outputs, tree.flatten(outputs), strict=True):
            values[id(x)] = y


def _run_block(block: Block, values: dict[int, Any], training: Any) -> None:
    """Runs ``block`` under ``tf.recompute_grad``, both passes from the same variable state."""
    import keras
    import tensorflow as tf

    start = [tf.convert_to_tensor(v) for v in block.states]
    updates: list[tuple[keras.Variable, tf.Tensor]] = []
    ran = False

    def forward(*inputs: tf.Tensor) -> list[tf.Tensor]:
        nonlocal ran
        local = {id(t): x for t, x in zip(block.inputs, inputs, strict=True)}
        mapping = list(zip(block.states, start, strict=True))
        with keras.StatelessScope(state_mapping=mapping) as scope:
            before = [scope.get_current_value(v) for v in block.states]
            _run_nodes(block.nodes, local, training)
        if not ran:  # the forward pass runs first; the recomputation's updates are dropped
            ran = True
            updates.extend((v, new) for v, old in zip(block.states, before, strict=True)
                           if (new := scope.get_current_value(v)) is not old)
        return [local[id(t)] for t in block.outputs]

    outputs = tf.recompute_grad(forward)(*(values[id(t)] for t in block.inputs))
    for variable, value in updates:
        variable.assign(value)
    for t, y in zip(block.outputs, outputs, strict=True):
        values[id(t)] = y
