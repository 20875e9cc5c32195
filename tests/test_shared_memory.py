"""The shared-memory node exchange (tfscale.exchange.shared_memory) between real processes,
and how the ddl strategy chooses it."""

from __future__ import annotations

import dataclasses
import multiprocessing
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import run_on_one_node
from tfscale.config.errors import describe_peer_failure, describe_wrapped_usage_error
from tfscale.exchange import shared_memory
from tfscale.exchange.hierarchical import HierarchicalAllReduce, open_shared_memory
from tfscale.exchange.shared_memory import PeerTimeout, SharedMemoryFull, SharedMemoryGroup
from tfscale.exchange.topology import Topology

# Calls of several tensors of one dtype, in shapes that do not fill whole cache lines: a scalar,
# an empty tensor, odd sizes; the float32 list comes back in the last call.
CALLS = [
    (np.float32, [(3, 5), (), (0,), (7,)]),
    (np.float16, [(33,), (2, 2)]),
    (np.float64, [(5,), (1, 1, 3)]),
    (np.float32, [(3, 5), (), (0,), (7,)]),
]


def inputs(index: int) -> list[list[np.ndarray]]:
    rng = np.random.default_rng(index)
    return [[rng.normal(size=s).astype(dtype) for s in shapes] for dtype, shapes in CALLS]


def _process(index: int, size: int, directory: str, queue: Any) -> None:
    exchange = SharedMemoryGroup("test", index, size, timeout_s=60, directory=Path(directory))
    # Copies: the results are views of buffers the exchange reuses.
    outs = [[o.copy() for o in exchange.all_reduce(*x)] for x in inputs(index)]
    # The two halves, as the multi-node path uses them: here the chunk doubled in between
    # (the cross-node sum of two identical nodes), then the mean over 4 processes.
    chunk = exchange.reduce_scatter(*inputs(index)[0])
    outs.append([o.copy() for o in exchange.all_gather(chunk * 2, divisor=4)])
    rows = exchange.gather(host_values(index))
    # A mean of tensors longer than the blocks the sum works in.
    outs.append([o.copy() for o in exchange.all_reduce(*long_inputs(index), divisor=size)])
    left = sorted(p.name for p in Path(directory).iterdir())
    # Bytes mapped for each segment (dtype, shapes), against its buffers' length in values.
    mapped = [(len(seg._map), seg.length, key[0]) for key, seg in exchange._segments.items()]
    queue.put((index, outs, left, (rows, mapped)))


def long_inputs(index: int) -> list[np.ndarray]:
    rng = np.random.default_rng(100 + index)
    return [rng.normal(size=s).astype(np.float32) for s in [(70001,), (3, 40000)]]


def host_values(index: int) -> np.ndarray:
    """What process ``index`` gathers: a NaN or an infinity must reach the others as it is."""
    return np.array([index, np.nan if index == 1 else np.inf, -0.5 * index])


def run_node(size: int, directory: Path) -> dict[int, tuple[Any, ...]]:
    return run_on_one_node(_process, size, directory)


@pytest.mark.parametrize("size", [2, 3, 4])
def test_all_reduce_is_the_sum_in_local_order_on_every_process(size: int,
                                                               tmp_path: Path) -> None:
    results = run_node(size, tmp_path)
    mine = [inputs(i) for i in range(size)]
    for call, (dtype, shapes) in enumerate(CALLS):
        for t, shape in enumerate(shapes):
            # Summed in local index order, in the tensors' own dtype.
            expected = mine[0][call][t].copy()
            for i in range(1, size):
                expected += mine[i][call][t]
            for i in range(size):
                got = results[i][0][call][t]
                assert got.dtype == dtype and got.shape == shape
                np.testing.assert_array_equal(got, expected)
    for t in range(len(CALLS[0][1])):
        expected = sum(mine[i][0][t] for i in range(size)) * 2 / 4
        for i in range(size):
            np.testing.assert_allclose(results[i][0][-2][t], expected, rtol=1e-6)
    # The mean: the parts summed in local order, then scaled by 1 / size, bit for bit.
    for t in range(2):
        expected = long_inputs(0)[t].copy()
        for i in range(1, size):
            expected += long_inputs(i)[t]
        expected *= np.float32(1.0 / size)
        for i in range(size):
            np.testing.assert_array_equal(results[i][0][-1][t], expected)
    # Each segment's file is removed once all processes have mapped it.
    assert all(left == [] for _, left, _ in results.values()), results
    # Host values: every process gets every row, in local order, exactly as sent.
    sent = np.stack([host_values(i) for i in range(size)])
    for i in range(size):
        np.testing.assert_array_equal(results[i][2][0], sent)
    # A segment holds L buffers of its length (at least 2: the results alternate between
    # calls) after its flags: the sums are made in the buffers the parts came in. Then the
    # weights region, of the same length (untouched here, so it takes no memory).
    header = 4 * size * 64
    for i in range(size):
        for mapped, length, dtype in results[i][2][1]:
            assert mapped == header + (max(size, 2) + 1) * length * np.dtype(dtype).itemsize


def _short_of_room(index: int, size: int, directory: str, queue: Any) -> None:
    exchange = SharedMemoryGroup("short", index, size, timeout_s=60, directory=Path(directory))
    f32 = np.dtype(np.float32)
    errors = []
    # The sharded update's segment takes its weights region too: three buffers of 400 kB do
    # not fit in 1 MiB. Asked again, it is refused again, without another file.
    for _ in range(2):
        try:
            exchange.segment(f32, ((100_000,),), owner="weights0")
        except SharedMemoryFull as err:
            errors.append(str(err))
    free = os.statvfs(directory).f_bavail * os.statvfs(directory).f_frsize
    # Two buffers of 280 kB fit; their pages are taken only once written, and a second such
    # segment is refused for the room the first will take.
    exchange.segment(f32, ((70_000,),))
    try:
        exchange.segment(f32, ((70_001,),))
    except SharedMemoryFull as err:
        errors.append(str(err))
    total = exchange.all_reduce(np.full(70_000, index + 1.0, np.float32))[0]
    left = sorted(p.name for p in Path(directory).iterdir())
    queue.put((index, errors, free, float(total.min()), float(total.max()), left))


def test_a_segment_that_the_directory_cannot_hold_is_refused_on_every_process(
        tmpfs: Callable[[str], Path]) -> None:
    small_shm = tmpfs("1m")
    results = run_on_one_node(_short_of_room, 2, small_shm)
    advice = (r"\. Give the node more shared memory \(a container's --shm-size, or a larger "
              rf"tmpfs on {small_shm}\), or take the node's exchange off it with "
              r"--node_exchange=collectives")
    for index in range(2):
        errors, free, low, high, left = results[index]
        # The same words on every process: the directory, its room, what was needed and why.
        assert errors == results[0][0] and len(errors) == 3 and errors[0] == errors[1], errors
        assert re.fullmatch(
            rf"{small_shm} has \d+\.\d MiB free of 1\.0 MiB, and the exchange of this node's 2 "
            r"processes through it needs 1\.1 MiB: 2 buffers and a weights region of 0\.4 MiB "
            r"\(float32 gradients of 1 tensors\)" + advice, errors[0]), errors[0]
        assert re.fullmatch(
            rf"{small_shm} has \d+\.\d MiB free of 1\.0 MiB \(0\.5 MiB of it for this job's "
            r"other segments\), and the exchange of this node's 2 processes through it needs "
            r"0\.5 MiB: 2 buffers of 0\.3 MiB \(float32 gradients of 1 tensors\)" + advice,
            errors[2]), errors[2]
        # A refused segment took no room, and nothing is left behind.
        assert free > 2**20 - 64 * 1024, free
        assert (low, high) == (3.0, 3.0) and left == []
    # Not a lost peer; raised inside tf.numpy_function, it reaches tfscale.train in the text of
    # TensorFlow's error, and is still told as itself (exit code 2).
    message = results[0][0][0]
    assert describe_peer_failure(SharedMemoryFull(message)) is None
    wrapped = (f"Traceback (most recent call last):\n  ...\ntfscale.exchange.shared_memory."
               f"SharedMemoryFull: {message}\n\n\n\t [[{{{{node tfscale_allreduce}}}}]]")
    assert describe_wrapped_usage_error(RuntimeError(wrapped)) == message


def test_host_all_reduce_takes_shared_memory_only_when_the_job_is_one_node(
        tmp_path: Path) -> None:
    node = SharedMemoryGroup("host", 0, 1, directory=tmp_path)
    one = HierarchicalAllReduce.on_one_node(node)
    assert one.one_node_shared_memory
    np.testing.assert_array_equal(one.host_all_reduce([1.0, -2.0], "max"), [1.0, -2.0])
    with pytest.raises(ValueError, match="all_reduce op 'median'; expected one of"):
        one.host_all_reduce([1.0], "median")
    # Several nodes (ddl's hierarchical exchange): the values must cross nodes, which only
    # the strategy's own transport does.
    two_nodes = dataclasses.replace(one, topology=Topology.regular(4, 2, 0))
    assert not two_nodes.one_node_shared_memory and two_nodes.host_all_reduce([1.0]) is None
    assert dataclasses.replace(one, node=None).host_all_reduce([1.0]) is None


def test_transient_results_are_aligned_views_of_two_alternating_buffers(tmp_path: Path) -> None:
    exchange = SharedMemoryGroup("one", 0, 1, directory=tmp_path)
    x = [np.arange(3, dtype=np.float32), np.ones((2, 2), np.float32)]
    first = exchange.all_reduce(*x, copy=False)
    second = exchange.all_reduce(*x, divisor=2, copy=False)
    # 64-byte aligned (TensorFlow then takes them without a copy).
    assert all(o.ctypes.data % 64 == 0 for o in first + second)
    np.testing.assert_array_equal(second[1], np.full((2, 2), 0.5, np.float32))
    # The next call did not write over the results of the one before it.
    np.testing.assert_array_equal(first[0], x[0])
    np.testing.assert_array_equal(first[1], x[1])
    third = exchange.all_reduce(*x, copy=False)
    address = [r[0].ctypes.data for r in (first, second, third)]
    assert address[0] == address[2] != address[1]
    # By default the results are copies, which later calls leave alone.
    kept = exchange.all_reduce(*x)
    for _ in range(2):
        exchange.all_reduce(*(2 * v for v in x), copy=False)
    np.testing.assert_array_equal(kept[0], x[0])
    with pytest.raises(ValueError, match=r"one dtype, not \['float32', 'float64'\]"):
        exchange.all_reduce(np.ones(2, np.float32), np.ones(2, np.float64))
    with pytest.raises(RuntimeError, match="pairs with the reduce_scatter before it"):
        exchange.all_gather(np.ones(2, np.float32))


def test_a_missing_peer_raises_naming_it(tmp_path: Path) -> None:
    exchange = SharedMemoryGroup("alone", 0, 2, timeout_s=0.3, directory=tmp_path, ranks=(4, 5))
    with pytest.raises(PeerTimeout, match=r"rank\(s\) \[5\] \(local process\(es\) \[1\]\) of "
                                          r"this node did not map .* within 0.3 s \(a peer died "
                                          r"or stalled\)") as err:
        exchange.all_reduce(np.ones(4, np.float32))
    # What the worker that stays prints, and its exit code 4 (a lost peer).
    assert (describe_peer_failure(err.value) or "").startswith("lost contact with worker 5 (")


def test_available_only_on_x86_64_with_a_writable_directory(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(shared_memory.platform, "machine", lambda: "x86_64")
    assert shared_memory.available(tmp_path) == ""
    assert "is not a writable directory" in shared_memory.available(tmp_path / "missing")
    monkeypatch.setattr(shared_memory.platform, "machine", lambda: "ppc64le")
    assert "ppc64le processor may reorder stores" in shared_memory.available(tmp_path)


class _FakeHorovod:
    """The collectives open_shared_memory runs, as in a job whose every process is this one:
    rank 0's token (here this process's) and the sum of the shared-memory domains (here
    this process's domain in every row)."""

    Sum = "sum"

    def __init__(self) -> None:
        self.broadcasts = 0
        self.allreduces = 0

    def broadcast(self, tensor: Any, root_rank: int, name: str) -> Any:
        self.broadcasts += 1
        return tensor

    def allreduce(self, tensor: Any, op: str, name: str) -> Any:
        import tensorflow as tf

        self.allreduces += 1
        table = tensor.numpy().reshape(-1, 64)
        mine = table[table.any(axis=1)][0]
        return tf.constant(np.tile(mine, (len(table), 1)).reshape(-1))

    def local_size(self) -> int:
        return 4


@pytest.mark.parametrize("layout, mode, machine, chosen", [
    ((2, 2), "auto", "x86_64", True),
    ((2, 2), "collectives", "x86_64", False),
    ((2, 2), "auto", "ppc64le", False),
    ((2, 1), "shared_memory", "x86_64", False),  # one process per node: no node phase
])
def test_node_exchange_choice(layout: tuple[int, int], mode: str, machine: str, chosen: bool,
                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_memory.platform, "machine", lambda: machine)
    hvd = _FakeHorovod()
    topology = Topology.regular(layout[0] * layout[1], layout[1], rank=1)
    exchange, plan = open_shared_memory(hvd, topology, mode)
    assert (exchange is not None) == chosen == plan.shared_memory
    assert hvd.broadcasts == 1, "every process joins the token's broadcast, whatever it chooses"
    assert hvd.allreduces == 1, "and the gathering of the shared-memory domains"
    if exchange is not None:
        assert (exchange.index, exchange.size) == (1, 2)


def test_shared_memory_is_refused_where_it_cannot_work(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_memory.platform, "machine", lambda: "aarch64")
    with pytest.raises(ValueError, match="--node_exchange=shared_memory cannot run: this "
                                         "aarch64 processor .* use --node_exchange="
                                         "collectives"):
        open_shared_memory(_FakeHorovod(), Topology.regular(2, 2, rank=0), "shared_memory")


def _exchange_once(index: int, size: int, directory: str) -> None:
    SharedMemoryGroup("gone", index, size, timeout_s=60, directory=Path(directory)).all_reduce(
        np.ones(4, np.float32))


def test_a_peer_that_exited_is_reported_at_once_not_after_the_timeout(tmp_path: Path) -> None:
    context = multiprocessing.get_context("spawn")
    peer = context.Process(target=_exchange_once, args=(1, 2, str(tmp_path)))
    peer.start()
    try:
        exchange = SharedMemoryGroup("gone", 0, 2, timeout_s=60, directory=tmp_path)
        exchange.all_reduce(np.ones(4, np.float32))
        start = time.monotonic()
        with pytest.raises(PeerTimeout, match=rf"rank\(s\) \[1\] \(local process\(es\) \[1\]\) "
                                              rf"of this node \(pid {peer.pid}\) exited before "
                                              r".* \(a peer died\)"):
            exchange.all_reduce(np.ones(4, np.float32))
        assert time.monotonic() - start < 10, "found by its pid, not by the 60 s timeout"
    finally:
        peer.join(timeout=10)
        if peer.is_alive():
            peer.kill()


def test_horovod_takes_shared_memory_only_on_one_node(monkeypatch: pytest.MonkeyPatch) -> None:
    from tfscale.config.train_config import TrainConfig
    from tfscale.strategies.horovod import HorovodStrategy

    monkeypatch.setattr(shared_memory.platform, "machine", lambda: "x86_64")

    class Comm:
        rank, size = 1, 4

        def __init__(self, nodes: int) -> None:
            self.hvd = _FakeHorovod()
            self.hvd.cross_size = lambda: nodes  # type: ignore[attr-defined]

    def reduction(mode: str, nodes: int) -> Any:
        strategy = HorovodStrategy(TrainConfig(strategy="horovod", node_exchange=mode))
        strategy.comm = Comm(nodes)  # type: ignore[assignment]
        return strategy.gradient_reduction()

    one_node = reduction("auto", 1)
    assert one_node.node_transport == "shared memory" and one_node.transient
    assert (one_node.topology.size, one_node.node.index, one_node.node.size) == (4, 1, 4)
    assert reduction("collectives", 1) is None
    # Across nodes the hierarchy needs Horovod's dynamic process sets, which the strategy's
    # setup turns on for a multi-node job (the cluster tests run it for real).
    assert reduction("auto", 2) is None
    for tool in ("horovod_timeline", "horovod_autotune"):  # they record and tune Horovod's
        strategy = HorovodStrategy(TrainConfig(strategy="horovod", **{tool: True}))
        strategy.comm = Comm(1)  # type: ignore[assignment]
        assert strategy.gradient_reduction() is None, tool
    with pytest.raises(ValueError, match=r"across 2 nodes, .*process_sets='dynamic'"):
        reduction("shared_memory", 2)


def test_multiworker_takes_shared_memory_only_with_equal_nodes() -> None:
    import tensorflow as tf

    from tfscale.config.train_config import TrainConfig
    from tfscale.strategies.multiworker import MultiWorkerStrategy

    def reduction(mode: str, workers: list[str], xla: str = "off") -> Any:
        strategy = MultiWorkerStrategy(TrainConfig(strategy="multiworker", node_exchange=mode,
                                                   xla=xla))
        strategy.tf_strategy, strategy._rank, strategy._size = tf.distribute.get_strategy(), 0, 1
        return strategy._shared_memory_reduce(workers)

    # One worker per host: nothing to share inside a node.
    assert reduction("auto", ["node1:2222", "node2:2222"]) is None
    assert reduction("shared_memory", ["node1:2222", "node2:2222"]) is None
    assert reduction("auto", ["localhost:1", "localhost:2"], xla="jit") is None
    assert reduction("collectives", ["localhost:1", "localhost:2"]) is None
    unequal = ["node1:1", "node1:2", "node2:1"]
    assert reduction("auto", unequal) is None
    with pytest.raises(ValueError, match=r"inside nodes only with as many workers on every "
                                         r"node, and the 2 hosts run node1 2, node2 1; use "
                                         "--node_exchange=collectives"):
        reduction("shared_memory", unequal)
