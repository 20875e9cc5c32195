"""The cross-node phase of multiworker's hierarchical all-reduce over plain TCP: a ring among
the processes with one local index, one per node.

TensorFlow's collective over the cluster's gRPC carried this phase before. Between two
processes on one core it costs 3.7-4.9 ns of host time per all-reduced byte against 1.0-1.3
for the same all-reduce over a socket (``python -m bench.transport_host_time``; gRPC copies
and serialises each message), and on CPU nodes that time comes out of the cores that compute:
on the two-node mini-cluster the ring made multiworker's hierarchical steps 16-19% faster at
10 and 25 Gbit/s (bench/RESULTS.md).

The ring: ``n`` processes split the buffer into ``n`` parts. In ``n - 1`` reduce-scatter steps
each process sends a part to the next process, receives one from the previous and adds its
own; then it holds one part summed over all processes, and ``n - 1`` all-gather steps pass the
summed parts round. Each process sends ``2(n-1)/n`` of the buffer, sending and receiving at
once (a thread sends). Each part is summed by one process and copied to the others, so every
process ends with the same bits.

Every message starts with a header (the call's number, the part's byte count and a tag of the
call site), so processes that reach different exchanges stop with an error instead of adding
mismatched bytes. A peer that exits closes its sockets, which ends the wait at once; one that
stalls is given ``timeout_s``.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import struct
import threading
import time
import zlib
from collections.abc import Callable, Sequence

import numpy as np

# (token, rank): the first bytes on a new connection, so that a stray one is turned away.
_HELLO = struct.Struct("<qq")
# (call number, bytes in the part, crc32 of the call's tag)
_HEADER = struct.Struct("<qqI")
_CONNECT_RETRY_S = 0.05
# How long a new connection has to say hello: the ring's own peers send it as they connect, so
# a connection that stays silent (a stray one) cannot hold up the ring's start for longer.
_HELLO_TIMEOUT_S = 10.0


class CrossNodeError(RuntimeError):
    """A process of the ring died, stalled or reached a different exchange."""


class SocketRing:
    """An all-reduce ring of ``size`` processes over TCP; use :func:`open_ring` to make one.

    Args:
        to_next: the connection to the next process of the ring (this process sends on it).
        from_previous: the connection from the previous one (this process receives on it).
        index: this process's place in the ring.
        ranks: the job's rank of each place, for error messages.
        timeout_s: how long a receive waits for the previous process.
    """

    def __init__(self, to_next: socket.socket, from_previous: socket.socket, index: int,
                 ranks: Sequence[int], timeout_s: float) -> None:
        self.index, self.ranks, self.size = index, tuple(ranks), len(ranks)
        self.timeout_s = timeout_s
        self._next, self._previous = to_next, from_previous
        for sock in (to_next, from_previous):
            sock.settimeout(timeout_s)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._calls = 0
        self._scratch = np.empty(0, np.uint8)  # a received part, before it is added
        self._broken = ""
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[tuple[bytes, memoryview] | None] = queue.SimpleQueue()
        self._sent: queue.SimpleQueue[BaseException | None] = queue.SimpleQueue()
        self._sender = threading.Thread(target=self._send_loop, name="tfscale-ring-send",
                                        daemon=True)
        self._sender.start()

    def all_reduce(self, values: np.ndarray, tag: str = "") -> np.ndarray:
        """The element-wise sum of ``values`` over the ring's processes (a new array; every
        process calls with the same shape, dtype and ``tag``, in the same order).

        Raises:
            CrossNodeError: when a peer closed its connection, did not send within
                ``timeout_s``, or sent another exchange's data.
        """
        flat = np.ascontiguousarray(values).reshape(-1)
        with self._lock:
            if self._broken:
                raise CrossNodeError(self._broken)
            try:
                return self._ring(flat, zlib.crc32(tag.encode())).reshape(np.shape(values))
            except CrossNodeError as err:
                self._broken = str(err)
                self.close()
                raise

    def _ring(self, flat: np.ndarray, tag: int) -> np.ndarray:
        n, i = self.size, self.index
        out = np.empty_like(flat)
        self._calls += 1
        edges = [k * flat.size // n for k in range(n + 1)]

        def part(k: int) -> slice:
            return slice(edges[k % n], edges[k % n + 1])

        largest = (-(-flat.size // n)) * flat.itemsize
        if self._scratch.size < largest:
            self._scratch = np.empty(largest, np.uint8)
        received = self._scratch[:largest].view(flat.dtype)
        for step in range(n - 1):  # reduce-scatter
            into = part(i - step - 1)
            got = received[:into.stop - into.start]
            self._exchange((flat if step == 0 else out)[part(i - step)], got, tag)
            np.add(flat[into], got, out=out[into])
        for step in range(n - 1):  # all-gather
            self._exchange(out[part(i + 1 - step)], out[part(i - step)], tag)
        return out

    def _exchange(self, send: np.ndarray, receive: np.ndarray, tag: int) -> None:
        """Sends ``send`` to the next process while receiving ``receive`` from the previous."""
        self._jobs.put((_HEADER.pack(self._calls, send.nbytes, tag), send.data.cast("B")))
        header = bytearray(_HEADER.size)
        self._receive(memoryview(header))
        calls, nbytes, their_tag = _HEADER.unpack(header)
        if (calls, nbytes, their_tag) != (self._calls, receive.nbytes, tag):
            raise CrossNodeError(
                f"cross-node exchange: rank(s) [{self.ranks[(self.index - 1) % self.size]}] "
                f"sent exchange {calls} ({nbytes} bytes, tag {their_tag:#x}) where this process, "
                f"rank {self.ranks[self.index]}, is at exchange {self._calls} "
                f"({receive.nbytes} bytes, tag {tag:#x}): the processes do not make the same "
                "exchanges in the same order")
        self._receive(receive.data.cast("B"))
        failed = self._sent.get()
        if failed is not None:
            who = self.ranks[(self.index + 1) % self.size]
            raise CrossNodeError(f"cross-node exchange: rank(s) [{who}] stopped receiving "
                                 f"({failed}; a peer died or stalled)") from failed

    def _receive(self, view: memoryview) -> None:
        who = self.ranks[(self.index - 1) % self.size]
        got = 0
        while got < len(view):
            try:
                count = self._previous.recv_into(view[got:])
            except TimeoutError:
                raise CrossNodeError(
                    f"cross-node exchange: rank(s) [{who}] did not send its part within "
                    f"{self.timeout_s:g} s (a peer died or stalled)") from None
            except OSError as err:
                raise CrossNodeError(f"cross-node exchange: rank(s) [{who}]: {err} "
                                     "(a peer died)") from err
            if not count:
                raise CrossNodeError(f"cross-node exchange: rank(s) [{who}] closed its "
                                     "connection (it exited: a peer died)")
            got += count

    def _send_loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            header, data = job
            try:
                self._next.sendall(header)
                self._next.sendall(data)
            except OSError as err:
                self._sent.put(err)
            else:
                self._sent.put(None)

    def close(self) -> None:
        """Closes the connections (a peer's wait ends at once) and stops the sending thread."""
        self._jobs.put(None)
        for sock in (self._next, self._previous):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def open_ring(rank: int, members: Sequence[int], hosts: Sequence[str], token: int,
              all_ports: Callable[[int], Sequence[int]], timeout_s: float) -> SocketRing:
    """Connects this process to the ring of ``members`` (job ranks, in ring order); a
    collective of the whole job, since ``all_ports`` is.

    Args:
        rank: this process's rank; must be in ``members``.
        members: the ring's ranks in order.
        hosts: every rank's host (address or name), by rank.
        token: the same on every process of the job and new for it: a connection that does
            not start with it is turned away.
        all_ports: given this process's listening port, every rank's port, by rank.
        timeout_s: how long to wait for a peer, while connecting and in each exchange.
    """
    index = list(members).index(rank)
    n = len(members)
    if n < 2:
        raise ValueError(f"a ring needs two or more processes, not {list(members)}")
    listener = _listen(n + 4)
    try:
        ports = all_ports(listener.getsockname()[1])
        deadline = time.monotonic() + timeout_s
        nxt, prev = members[(index + 1) % n], members[(index - 1) % n]
        to_next = _connect(hosts[nxt], ports[nxt], nxt, deadline)
        to_next.sendall(_HELLO.pack(token, rank))
        from_previous = _accept(listener, token, prev, deadline)
        return SocketRing(to_next, from_previous, index, members, timeout_s)
    finally:
        listener.close()


def _listen(backlog: int) -> socket.socket:
    """A listening socket on every interface, as TensorFlow's gRPC server listens (a host name
    may resolve to another of the host's addresses than the one its peers reach): IPv6 and
    IPv4 where the host can, else IPv4."""
    if socket.has_dualstack_ipv6():
        with contextlib.suppress(OSError):
            return socket.create_server(("", 0), family=socket.AF_INET6, backlog=backlog,
                                        dualstack_ipv6=True)
    return socket.create_server(("", 0), backlog=backlog)


def _connect(host: str, port: int, rank: int, deadline: float) -> socket.socket:
    while True:
        try:
            return socket.create_connection((host, port),
                                            timeout=max(deadline - time.monotonic(), 0.1))
        except OSError as err:
            if time.monotonic() > deadline:
                raise CrossNodeError(f"cross-node exchange: rank(s) [{rank}] at {host}:{port} "
                                     f"did not accept a connection ({err})") from err
            time.sleep(_CONNECT_RETRY_S)


def _accept(listener: socket.socket, token: int, rank: int, deadline: float) -> socket.socket:
    while True:
        listener.settimeout(max(deadline - time.monotonic(), 0.0))
        try:
            sock, _ = listener.accept()
        except TimeoutError:
            raise CrossNodeError(f"cross-node exchange: rank(s) [{rank}] did not connect "
                                 "(a peer died or stalled)") from None
        sock.settimeout(min(max(deadline - time.monotonic(), 0.1), _HELLO_TIMEOUT_S))
        hello = bytearray(_HELLO.size)
        try:
            got = sock.recv_into(hello, _HELLO.size, socket.MSG_WAITALL)
        except OSError:
            got = 0
        if got == _HELLO.size and _HELLO.unpack(hello) == (token, rank):
            return sock
        sock.close()  # not the ring's previous process: a stray connection
