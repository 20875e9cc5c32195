"""tfscale.exchange.socket_ring: the multiworker cross-node phase over TCP, between real
processes on 127.0.0.1 (the two-node cluster runs it inside training: test_minicluster)."""

from __future__ import annotations

import multiprocessing
import os
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tfscale.config.errors import describe_peer_failure
from tfscale.exchange import socket_ring
from tfscale.exchange.socket_ring import CrossNodeError, SocketRing, open_ring

TOKEN = 0x5EED


def _ports_through(directory: Path, rank: int, n: int) -> Callable[[int], list[int]]:
    """A stand-in for the job's collective: every rank's port, through files."""
    def all_ports(port: int) -> list[int]:
        (directory / f"{rank}.tmp").write_text(str(port))
        (directory / f"{rank}.tmp").rename(directory / f"{rank}.port")
        deadline = time.monotonic() + 60
        while not all((directory / f"{r}.port").exists() for r in range(n)):
            assert time.monotonic() < deadline, "the other processes did not publish a port"
            time.sleep(0.01)
        return [int((directory / f"{r}.port").read_text()) for r in range(n)]
    return all_ports


def _ring(directory: Path, rank: int, n: int, timeout_s: float = 600.0) -> SocketRing:
    return open_ring(rank, list(range(n)), ["127.0.0.1"] * n, TOKEN,
                     _ports_through(directory, rank, n), timeout_s)


def _values(rank: int, size: int, dtype: str) -> np.ndarray:
    return np.random.default_rng(rank * 1000 + size).standard_normal(size).astype(dtype)


def _sums(directory: Path, rank: int, n: int, out: Any) -> None:
    ring = _ring(directory, rank, n)
    got = {}
    for size in (1, 2, 7, 1000, 100_003):
        for dtype in ("float32", "float16"):
            got[size, dtype] = ring.all_reduce(_values(rank, size, dtype), f"sum {size}")
    got["shaped"] = ring.all_reduce(np.full((3, 5), rank + 1, np.float32), "shaped")
    ring.close()
    out.put((rank, got))


def _collect(out: Any, n: int, procs: list[Any]) -> dict[int, Any]:
    results = {}
    try:
        for _ in range(n):
            rank, got = out.get(timeout=120)
            results[rank] = got
    finally:
        for proc in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
                proc.join()
    return results


def _start(target: Callable[..., None], n: int, *args: Any) -> tuple[Any, list[Any]]:
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    procs = [context.Process(target=target, args=(*args, rank, n, out)) for rank in range(n)]
    for proc in procs:
        proc.start()
    return out, procs


@pytest.mark.parametrize("n", [2, 3])
def test_every_process_gets_the_same_bits_of_the_sum(n: int, tmp_path: Path) -> None:
    """n processes x their values = one process's sum of all (< 1e-5 in float32, < 1e-2 in
    float16), identical bits everywhere, for sizes below, at and far above n."""
    out, procs = _start(_sums, n, tmp_path)
    results = _collect(out, n, procs)
    assert sorted(results) == list(range(n))
    for key, first in results[0].items():
        for rank in range(1, n):
            assert results[rank][key].tobytes() == first.tobytes(), (key, rank)
        if key == "shaped":
            assert first.shape == (3, 5) and (first == n * (n + 1) / 2).all()
            continue
        size, dtype = key
        reference = sum(_values(rank, size, dtype).astype(np.float64) for rank in range(n))
        assert first.dtype == np.dtype(dtype) and first.shape == (size,)
        tolerance = 1e-5 if dtype == "float32" else 1e-2
        assert np.max(np.abs(first - reference) / np.maximum(np.abs(reference), 1)) < tolerance


def _one_exits(directory: Path, rank: int, n: int, out: Any) -> None:
    ring = _ring(directory, rank, n)
    ring.all_reduce(np.ones(10, np.float32))
    if rank == n - 1:
        os._exit(0)  # as a killed worker: no close, the kernel closes its sockets
    try:
        ring.all_reduce(np.ones(1_000_000, np.float32))
        out.put((rank, "no error"))
    except CrossNodeError as err:
        out.put((rank, str(err)))


def test_a_peer_that_exits_stops_the_others_at_once_naming_it(tmp_path: Path) -> None:
    """The exchange timeout is 600 s; the survivors' errors come long before the test's 120 s
    wait ends, because the dead peer's sockets close."""
    n = 3
    out, procs = _start(_one_exits, n, tmp_path)
    errors = _collect(out, n - 1, procs)
    assert sorted(errors) == [0, 1]
    assert errors[0].startswith("cross-node exchange: rank(s) [2] closed its connection")
    for error in errors.values():
        assert error.startswith("cross-node exchange: rank(s) ["), error
        assert "died" in error, error
    # Through TensorFlow (the message inside an op's error), training stops as for a lost peer.
    assert (describe_peer_failure(RuntimeError(f"UnknownError: {errors[0]}")) or "").startswith(
        "lost contact with worker 2 (")


def _mismatched(directory: Path, rank: int, n: int, out: Any) -> None:
    ring = _ring(directory, rank, n)
    try:
        ring.all_reduce(np.ones(8, np.float32), "gradients" if rank == 0 else "metrics")
        out.put((rank, "no error"))
    except CrossNodeError as err:
        out.put((rank, str(err)))
    ring.close()


def test_processes_at_different_exchanges_stop_instead_of_adding_them(tmp_path: Path) -> None:
    """Both stop; the one that reads the other's header first says why (the other may find
    the connection closed before that header was sent)."""
    out, procs = _start(_mismatched, 2, tmp_path)
    errors = _collect(out, 2, procs)
    assert sorted(errors) == [0, 1]
    assert any("do not make the same exchanges in the same order" in e
               for e in errors.values()), errors
    assert all(e.startswith("cross-node exchange: rank(s) [") for e in errors.values()), errors


def test_stray_connections_are_turned_away(tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Two other connections reach a ring's port first, one with the wrong bytes and one that
    stays silent (given 0.5 s to say hello instead of 10): the ring still forms."""
    monkeypatch.setattr(socket_ring, "_HELLO_TIMEOUT_S", 0.5)

    def all_ports(port: int) -> list[int]:
        strays.append(socket.create_connection(("127.0.0.1", port)))
        strays[-1].sendall(b"not a ring hello")
        strays.append(socket.create_connection(("127.0.0.1", port)))
        return ports_of_two(port)

    strays: list[socket.socket] = []
    directory = tmp_path
    ports_of_two = _ports_through(directory, 0, 2)
    context = multiprocessing.get_context("fork")
    out = context.Queue()
    peer = context.Process(target=_sums_pair, args=(directory, out))
    peer.start()
    try:
        ring = open_ring(0, [0, 1], ["127.0.0.1"] * 2, TOKEN, all_ports, 60.0)
        got = ring.all_reduce(np.arange(5, dtype=np.float32), "pair")
        ring.close()
        assert out.get(timeout=60) == got.tolist() == [0.0, 3.0, 6.0, 9.0, 12.0]
    finally:
        for stray in strays:
            stray.close()
        peer.join(timeout=30)
        if peer.is_alive():
            peer.kill()
            peer.join()


def _sums_pair(directory: Path, out: Any) -> None:
    ring = _ring(directory, 1, 2, 60.0)
    out.put(ring.all_reduce(2 * np.arange(5, dtype=np.float32), "pair").tolist())
    ring.close()


def test_a_ring_of_one_is_refused() -> None:
    with pytest.raises(ValueError, match="two or more"):
        open_ring(0, [0], ["127.0.0.1"], TOKEN, lambda port: [port], 1.0)
