"""SGD's momentum update sharded over a node's processes (tfscale.exchange.sharded_update)
between real processes: every process ends each step with the weights of the unsharded update
of the summed gradients, bit for bit; its momentum is its own chunk's until gathered, and then
the whole momentum; and which optimizers and exchanges it applies to."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import run_on_one_node
from tfscale.exchange import native, sharded_update
from tfscale.exchange.shared_memory import SharedMemoryGroup

# Odd sizes, a scalar, and tensors longer than the op's block (8,192 values) that the chunks of
# two and three processes cut in the middle.
SHAPES = [(3, 5), (), (7,), (70001,), (3, 40000), (512, 33)]
STEPS = 3


def _start(shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    return [rng.normal(size=s).astype(np.float32) for s in shapes]


def _gradients(index: int, step: int) -> list[np.ndarray]:
    rng = np.random.default_rng(100 * index + step)
    return [rng.normal(size=s).astype(np.float32) for s in SHAPES]


def _process(index: int, size: int, directory: str, queue: Any) -> None:
    import tensorflow as tf

    from tfscale.exchange.hierarchical import HierarchicalAllReduce
    from tfscale.training.optimizers.sgd import SGD

    group = SharedMemoryGroup("sharded", index, size, timeout_s=60, directory=Path(directory))
    reduce = HierarchicalAllReduce.on_one_node(group)
    out: dict[Any, Any] = {}
    models = []
    for nesterov in (False, True):
        weights = [tf.Variable(w) for w in _start(SHAPES)]
        expected = [tf.Variable(w) for w in _start(SHAPES)]
        optimizer = SGD(learning_rate=0.05, momentum=0.9, nesterov=nesterov)
        reference = SGD(learning_rate=0.05, momentum=0.9, nesterov=nesterov)
        optimizer.build(weights)
        reference.build(expected)
        why = sharded_update.why_not_optimizer(optimizer) + sharded_update.why_not_exchange(reduce)

        @tf.function(autograph=False)
        def step(grads: list[Any], optimizer: Any = optimizer, weights: Any = weights) -> Any:
            done = sharded_update.apply(optimizer, reduce, grads, weights,
                                        optimizer.learning_rate)
            assert done is not None, "the op takes these gradients"
            return done  # the exchange's number

        kinds = {op.type for op in step.get_concrete_function(
            [tf.TensorSpec(s, tf.float32) for s in SHAPES]).graph.get_operations()}
        steps, numbers = [], []
        for s in range(STEPS):
            numbers.append(int(step([tf.constant(g) for g in _gradients(index, s)])))
            # The unsharded update of the node's sum, added in local index order as the
            # exchange adds.
            parts = [_gradients(i, s) for i in range(size)]
            total = [parts[0][k] + parts[1][k] for k in range(len(SHAPES))]
            for p in parts[2:]:
                total = [t + g for t, g in zip(total, p, strict=True)]
            reference.apply([tf.constant(t) for t in total], expected)
            steps.append(([w.numpy() for w in weights], [m.numpy() for m in optimizer.momentums],
                          [w.numpy() for w in expected],
                          [m.numpy() for m in reference.momentums]))
        models.append((optimizer, weights, step))
        # The op's segment, the optimizer's own.
        segment = group.segment(np.dtype(np.float32), tuple(SHAPES),
                                optimizer._tfscale_weights_owner)
        # Which variables keep their weights in the segment's weights region: a mark written
        # there in this process's chunk shows in the variable (None: no part in the chunk).
        # The region is every process's: marked only once all have read their weights.
        group.gather(np.zeros(1, np.float32))
        kept = []
        for w, s, offset in zip(weights, SHAPES, segment.offsets, strict=True):
            mine = sharded_update.own_part(np.ones(s, np.float32), offset,
                                           segment.chunk).astype(bool)
            place = segment.weights[offset:offset + int(np.prod(s))].reshape(s)
            saved = place[mine].copy()
            place[mine] = 12345.0
            kept.append(bool(np.all(w.numpy()[mine] == 12345.0)) if mine.any() else None)
            place[mine] = saved
        group.gather(np.zeros(1, np.float32))
        sharded_update.gather_momentum(optimizer)
        gathered = [m.numpy() for m in optimizer.momentums]
        own = [sharded_update.own_part(np.ones(s, np.float32), offset, segment.chunk)
               for s, offset in zip(SHAPES, segment.offsets, strict=True)]
        out[nesterov] = (why, sorted(kinds), steps, gathered, own, numbers, kept)
    # Two models on one weights region would change each other's weights: an optimizer made to
    # share the first one's segment is refused before anything is written.
    first, first_weights, _ = models[0]
    before = [w.numpy() for w in first_weights]
    intruder_weights = [tf.Variable(w) for w in _start(SHAPES)]
    intruder = SGD(learning_rate=0.05, momentum=0.9)
    intruder.build(intruder_weights)
    intruder._tfscale_weights_owner = first._tfscale_weights_owner
    try:
        tf.function(autograph=False)(lambda grads: sharded_update.apply(
            intruder, reduce, grads, intruder_weights, intruder.learning_rate))(
            [tf.constant(g) for g in _gradients(index, 0)])
        refused = ""
    except tf.errors.FailedPreconditionError as err:
        refused = err.message
    out["intruder"] = (refused, all(np.array_equal(b, w.numpy())
                                    for b, w in zip(before, first_weights, strict=True)))
    queue.put((index, out))


@pytest.mark.parametrize("size", [2, 3])
def test_each_process_updates_its_chunk_and_all_end_with_the_unsharded_weights(
        size: int, tmp_path: Path) -> None:
    assert native.library() is not None, "the op builds and loads on this machine"
    got = run_on_one_node(_process, size, tmp_path, timeout=180)
    assert sorted(got) == list(range(size))
    for index, (out,) in got.items():
        refused, untouched = out.pop("intruder")
        assert "place in the segment's weights region is another variable's" in refused, refused
        assert untouched, f"process {index}: the refused call changed the first model's weights"
        for nesterov, (why, kinds, steps, gathered, own, numbers, kept) in out.items():
            label = f"process {index}, nesterov={nesterov}"
            assert why == "", why
            # Each model's variables keep their weights in its own segment's weights region.
            assert set(kept) - {None} == {True}, (label, kept)
            # Numbered on from the calls before on the same segment (the first trace's).
            assert numbers == list(range(numbers[0], numbers[0] + STEPS)), numbers
            assert "TfscaleNodeAllReduceMomentum" in kinds
            assert not {"PyFunc", "EagerPyFunc", "ResourceApplyKerasMomentum"} & set(kinds)
            for s, (weights, momentums, expected, expected_m) in enumerate(steps):
                for k, (w, e) in enumerate(zip(weights, expected, strict=True)):
                    np.testing.assert_array_equal(w, e, err_msg=f"{label}, step {s}, weight {k}")
                    np.testing.assert_array_equal(w, got[0][0][nesterov][2][s][0][k])
                for k, (m, e, mine) in enumerate(zip(momentums, expected_m, own, strict=True)):
                    mine = mine.astype(bool)
                    # This process's chunk is the unsharded momentum ...
                    np.testing.assert_array_equal(m[mine], e[mine], err_msg=f"{label}, {k}")
                    # ... and the rest is what it was before the first step: zero.
                    assert not np.any(m[~mine]), f"{label}, momentum {k} outside the chunk"
            # Every process updated a share, and together all of it.
            shares = [sum(int(o.sum()) for o in got[i][0][nesterov][4]) for i in range(size)]
            assert min(shares) > 0 and sum(shares) == sum(int(np.prod(s)) for s in SHAPES)
            for k, (m, e) in enumerate(zip(gathered, steps[-1][3], strict=True)):
                np.testing.assert_array_equal(m, e, err_msg=f"{label}, gathered momentum {k}")


def _short_of_room(index: int, size: int, directory: str, queue: Any) -> None:
    import contextlib
    import io

    import tensorflow as tf

    from tfscale.exchange.hierarchical import HierarchicalAllReduce, native_all_reduce
    from tfscale.training.optimizers.sgd import SGD

    group = SharedMemoryGroup("short", index, size, timeout_s=60, directory=Path(directory))
    reduce = HierarchicalAllReduce.on_one_node(group)
    weights = [tf.Variable(w) for w in _start(SHAPES)]
    optimizer = SGD(learning_rate=0.05, momentum=0.9)
    optimizer.build(weights)
    grads = [tf.constant(g) for g in _gradients(index, 0)]
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        # Refused once, with a line that says why; then not tried again.
        done = [sharded_update.apply(optimizer, reduce, grads, weights, optimizer.learning_rate)
                for _ in range(2)]
    # The exchange without the weights region fits, and sums.
    sums = native_all_reduce(group, grads, divisor=1, copy=True, name="plain")
    queue.put((index, done, printed.getvalue(), [s.numpy() for s in sums]))


def test_a_weights_region_that_shared_memory_cannot_hold_leaves_the_whole_update(
        tmpfs: Callable[[str], Path]) -> None:
    # The gradients take 0.8 MiB a buffer: two fit in 2 MiB, three do not.
    got = run_on_one_node(_short_of_room, 2, tmpfs("2m"), timeout=180)
    for done, printed, sums in got.values():
        assert done == [None, None], done
        assert printed.count("\n") == 1 and printed.startswith(
            "SGD's momentum update not sharded: "), printed
        assert "needs 2.4 MiB: 2 buffers and a weights region of 0.8 MiB" in printed, printed
        assert printed.endswith("Every worker applies the whole update.\n"), printed
        for k, total in enumerate(sums):
            np.testing.assert_array_equal(total, _gradients(0, 0)[k] + _gradients(1, 0)[k])


def test_only_sgds_own_momentum_update_with_nothing_in_between_is_sharded() -> None:
    import keras

    from tfscale.training.optimizers.sgd import SGD

    class Custom(keras.optimizers.SGD):
        def update_step(self, gradient: Any, variable: Any, learning_rate: Any) -> None:
            super().update_step(gradient, variable, learning_rate)

    why = sharded_update.why_not_optimizer
    assert why(SGD(0.1, momentum=0.9)) == ""
    assert why(keras.optimizers.SGD(0.1, momentum=0.9, nesterov=True)) == ""
    assert why(SGD(0.1)) == "SGD without momentum has no state to shard"
    assert why(keras.optimizers.Adam()) == "Adam is not SGD"
    assert why(Custom(0.1, momentum=0.9)) == "Custom has its own update_step"
    assert why(SGD(0.1, momentum=0.9, clipnorm=1.0)) == (
        "clipnorm=1.0 needs every gradient or weight")
    assert why(SGD(0.1, momentum=0.9, weight_decay=1e-4)).startswith("weight_decay=")
    assert why(SGD(0.1, momentum=0.9, use_ema=True)) == "use_ema averages every weight"
    scaled = keras.optimizers.LossScaleOptimizer(SGD(0.1, momentum=0.9))
    assert why(scaled).startswith("a LossScaleOptimizer")
    assert sharded_update.why_not_exchange(None) == (
        "the gradients are not exchanged through a node's shared memory")
    assert sharded_update.choose(False, SGD(0.1, momentum=0.9), None) == (None, "")


def test_gathering_a_momentum_that_no_step_sharded_does_nothing() -> None:
    import tensorflow as tf

    from tfscale.training.optimizers.sgd import SGD

    optimizer = SGD(0.1, momentum=0.9)
    optimizer.build([tf.Variable(np.ones(3, np.float32))])
    optimizer.momentums[0].assign(np.full(3, 2.0, np.float32))
    sharded_update.gather_momentum(optimizer)  # no segment to call: returns at once
    assert not sharded_update.sharded(optimizer)
    np.testing.assert_array_equal(optimizer.momentums[0].numpy(), [2.0, 2.0, 2.0])
