"""The shared-memory exchange as TensorFlow ops (tfscale.exchange.native) between real
processes: the node's all-reduce, and its reduce-scatter and all-gather around a cross-node
sum, bit for bit what the Python exchange gives, on the same segments, and the same errors
when a peer dies or stalls."""

from __future__ import annotations

import multiprocessing
import os
import signal
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.conftest import run_on_one_node
from tfscale.config.errors import describe_peer_failure
from tfscale.exchange import native
from tfscale.exchange.hierarchical import native_all_reduce, native_node_phases
from tfscale.exchange.shared_memory import SharedMemoryGroup

# Shapes that do not fill whole cache lines (a scalar, an empty tensor, odd sizes), and two
# longer than a block of the Python sum.
SHORT = [(3, 5), (), (0,), (7,)]
LONG = [(70001,), (3, 40000)]


def _tensors(index: int, shapes: list[tuple[int, ...]], dtype: Any) -> list[np.ndarray]:
    rng = np.random.default_rng(10 * index + len(shapes))
    return [rng.normal(size=s).astype(dtype) for s in shapes]


def _calls(index: int) -> list[tuple[list[np.ndarray], int, bool]]:
    """(tensors, divisor, views) of each call, the same list on every process."""
    return [(_tensors(index, SHORT, np.float32), 1, True),
            (_tensors(index, SHORT, np.float64), 3, False),
            (_tensors(index, LONG, np.float32), 1, True),
            (_tensors(index, LONG, np.float32), 2, True)]


def _process(index: int, size: int, directory: str, queue: Any) -> None:
    import tensorflow as tf

    group = SharedMemoryGroup("native", index, size, timeout_s=60, directory=Path(directory))
    outs, kinds = [], set()
    for tensors, divisor, views in _calls(index):
        @tf.function
        def step(values: list[Any], divisor: int = divisor, views: bool = views) -> Any:
            # Three calls in a row: the results buffers alternate, and the counter goes on.
            results = None
            for _ in range(3):
                results = native_all_reduce(group, values, divisor, not views, "sum")
            return results

        @tf.function
        def phases(values: list[Any], divisor: int = divisor, views: bool = views) -> Any:
            # The node phases of a job on several nodes, twice in a row; doubling the chunk
            # stands in for the cross-node sum of two nodes that hold the same tensors.
            results = None
            for _ in range(2):
                pair = native_node_phases(group, values, "phases")
                assert pair is not None
                results = pair.all_gather(pair.reduce_scatter() * 2, divisor, not views)
            return results

        constants = [tf.constant(t) for t in tensors]
        native_out = [o.numpy().copy() for o in step(constants)]
        # The Python exchange on the same segment right after: its calls number on.
        python_out = [o.copy() for o in group.all_reduce(*tensors, divisor=divisor)]
        native_phases = [o.numpy().copy() for o in phases(constants)]
        python_phases = [o.copy() for o in group.all_gather(
            group.reduce_scatter(*tensors) * 2, divisor=divisor)]
        for function in (step, phases):
            kinds |= {op.type for op in
                      function.get_concrete_function(constants).graph.get_operations()}
        outs.append((native_out, python_out, native_phases, python_phases))
    queue.put((index, outs, sorted(kinds)))


@pytest.mark.parametrize("size", [2, 3])
def test_the_op_gives_the_python_exchanges_sums_bit_for_bit(size: int, tmp_path: Path) -> None:
    assert native.library() is not None, "the op builds and loads on this machine"
    got = run_on_one_node(_process, size, tmp_path, timeout=120)
    results = {index: outs for index, (outs, _) in got.items()}
    assert sorted(results) == list(range(size))
    for _, kinds in got.values():  # the steps run the ops, not a host call
        assert {"TfscaleNodeAllReduce", "TfscaleNodeReduceScatter",
                "TfscaleNodeAllGather"} <= set(kinds)
        assert not {"PyFunc", "EagerPyFunc"} & set(kinds)
    for c, (tensors, divisor, _) in enumerate(_calls(0)):
        parts = [_calls(i)[c][0] for i in range(size)]
        for index in range(size):
            native_out, python_out, native_phases, python_phases = results[index][c]
            for k, (got, want) in enumerate(zip(native_out, python_out, strict=True)):
                assert got.dtype == tensors[k].dtype and got.shape == tensors[k].shape
                np.testing.assert_array_equal(got, want, err_msg=f"call {c}, tensor {k}")
                # ... and the same on every process, and the mean it stands for.
                np.testing.assert_array_equal(got, results[0][c][0][k])
                expected = sum(p[k].astype(np.float64) for p in parts) / divisor
                np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
            for k, (got, want) in enumerate(zip(native_phases, python_phases, strict=True)):
                assert got.dtype == tensors[k].dtype and got.shape == tensors[k].shape
                np.testing.assert_array_equal(got, want, err_msg=f"phases {c}, tensor {k}")
                np.testing.assert_array_equal(got, results[0][c][2][k])
                expected = 2 * sum(p[k].astype(np.float64) for p in parts) / divisor
                np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


def _python_peer(directory: str, calls: int, stall: bool) -> None:
    group = SharedMemoryGroup("peer", 1, 2, timeout_s=60, directory=Path(directory))
    for _ in range(calls):
        group.all_reduce(np.ones(5, np.float32))
    if stall:
        group.segment(np.dtype(np.float32), ((5,),))
        time.sleep(120)


@pytest.mark.parametrize("stall", [False, True])
def test_a_peer_that_exits_or_stalls_is_reported_as_the_python_exchange_does(
        stall: bool, tmp_path: Path) -> None:
    import tensorflow as tf

    context = multiprocessing.get_context("spawn")
    peer = context.Process(target=_python_peer, args=(str(tmp_path), 1, stall))
    peer.start()
    try:
        group = SharedMemoryGroup("peer", 0, 2, timeout_s=60 if not stall else 1.5,
                                  directory=tmp_path, ranks=(4, 5))
        value = tf.ones(5)
        # The first call pairs with the peer's Python call on the same segment.
        first = native_all_reduce(group, [value], 1, True, "sum")
        assert first is not None
        np.testing.assert_array_equal(first[0].numpy(), np.full(5, 2, np.float32))
        # An all-gather with no reduce-scatter before it says so, and waits for no one.
        lone = native_node_phases(group, [value], "lone")
        assert lone is not None
        chunk = tf.zeros(group.segment(np.dtype(np.float32), ((5,),)).length // 2)
        with pytest.raises(tf.errors.FailedPreconditionError,
                           match="no TfscaleNodeReduceScatter made exchange 2 on this segment"):
            lone.all_gather(chunk, 1, True)
        start = time.monotonic()
        if stall:
            want = (r"shared-memory exchange: rank\(s\) \[5\] \(local process\(es\) \[1\]\) of "
                    r"this node did not write its tensors for exchange 2 within 1.5 s \(a peer "
                    r"died or stalled\)")
            raises: Any = tf.errors.DeadlineExceededError
        else:
            peer.join(timeout=30)
            want = (rf"shared-memory exchange: rank\(s\) \[5\] \(local process\(es\) \[1\]\) of "
                    rf"this node \(pid {peer.pid}\) exited before they could write its tensors "
                    r"for exchange 2 \(a peer died\)")
            raises = tf.errors.UnavailableError
        with pytest.raises(raises, match=want) as caught:
            native_all_reduce(group, [value], 1, True, "sum")
        assert time.monotonic() - start < 20, "found by its pid or the timeout, not later"
        assert str(describe_peer_failure(caught.value)).startswith("lost contact with worker 5 ")
    finally:
        if peer.is_alive() and peer.pid is not None:
            os.kill(peer.pid, signal.SIGKILL)
        peer.join(timeout=10)


def test_without_a_compiler_the_build_says_so_and_the_exchange_stays_in_python(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # no build of the op there yet
    monkeypatch.setenv("CXX", "no-such-compiler")
    with pytest.raises(RuntimeError, match="no C\\+\\+ compiler 'no-such-compiler' on PATH"):
        native.build()
    assert not list((tmp_path / "tfscale" / "native").glob("*.so"))
    native.library.cache_clear()
    try:
        with pytest.warns(UserWarning, match="runs in tf.numpy_function, not as its TensorFlow "
                                             "op: no C\\+\\+ compiler"):
            assert native.library() is None
        group = SharedMemoryGroup("unused", 0, 2, directory=tmp_path)
        import tensorflow as tf

        assert native_all_reduce(group, [tf.ones(3)], 1, True, "sum") is None
    finally:
        native.library.cache_clear()


def test_a_failed_build_names_the_source_and_the_compilers_errors(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    broken = tmp_path / "node_all_reduce.cc"
    broken.write_text("#error this source does not compile\n")
    monkeypatch.setattr(native, "SOURCE", broken)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    with pytest.raises(RuntimeError, match=rf"compiling {broken} failed .*\n.*this source does "
                                           "not compile"):
        native.build()
    assert not list((tmp_path / "cache").rglob("*.so")) and not list(
        (tmp_path / "cache").rglob("*.tmp")), "nothing half-built is left"


def test_copies_of_the_source_share_one_build(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The build is keyed by the source's bytes, not its path: another checkout or an install
    of the same source finds the op already built (another source does not)."""
    here = native.library_path()
    copy = tmp_path / "elsewhere" / native.SOURCE.name
    copy.parent.mkdir()
    copy.write_bytes(native.SOURCE.read_bytes())
    monkeypatch.setattr(native, "SOURCE", copy)
    assert native.library_path() == here
    copy.write_bytes(copy.read_bytes() + b"\n")
    assert native.library_path() != here


def test_each_kind_of_cpu_gets_its_own_build(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A build for this CPU's instruction set (-march=native) may not run on another, so the
    key holds the CPU's model and flags: nodes that share a home directory but not a CPU
    each build their own."""
    cpuinfo = tmp_path / "cpuinfo"
    block = ("processor\t: {n}\nvendor_id\t: AuthenticAMD\ncpu family\t: 25\nmodel\t\t: 17\n"
             "model name\t: AMD EPYC\nflags\t\t: fpu sse2 {flags}\n\n")
    cpuinfo.write_text(block.format(n=0, flags="avx2 avx512f")
                       + block.format(n=1, flags="something else"))
    kind = native.cpu_kind(cpuinfo)
    assert kind.splitlines() == ["vendor_id: AuthenticAMD", "cpu family: 25", "model: 17",
                                 "model name: AMD EPYC", "flags: fpu sse2 avx2 avx512f"]
    assert native.cpu_kind(tmp_path / "missing") == ""
    assert "-march=native" in native._command(tmp_path / "out.so")
    here = native.library_path()
    monkeypatch.setattr(native, "cpu_kind", lambda: kind)
    assert native.library_path() != here


def test_a_cpu_with_fp16_vectors_builds_without_them(tmp_path: Path) -> None:
    """On a Xeon with AVX512-FP16, ``-march=native`` makes TensorFlow 2.21's Eigen compile FP16
    packet code that does not compile: the build asks the compiler what ``-march=native``
    turns on and leaves that extension off, only where it is on."""
    for defines, wanted in (("#define __AVX512FP16__ 1", True), ("#define __AVX512F__ 1", False)):
        compiler = tmp_path / f"cxx-{wanted}"
        compiler.write_text(f"#!/bin/sh\necho '#define __AVX2__ 1'\necho '{defines}'\n")
        compiler.chmod(0o755)
        assert ("-mno-avx512fp16" in native._without_fp16_vectors(str(compiler))) is wanted
    assert native._without_fp16_vectors(str(tmp_path / "no-such-compiler")) == ()
