"""Reduce-scatter and all-gather among the processes of one node through shared memory.

The node phases of :mod:`tfscale.exchange.hierarchical` move a whole gradient buffer between
processes of the same machine. Over Horovod's Gloo transport that is TCP over loopback: on a
CPU node of this project's test machine, 7.4 MB took 15 ms for two processes, three times the
compute of the step. Shared memory does it with a few memory copies (about 1 ms), which is
what IBM DDL did inside a node.

One segment per node and list of tensor sizes (one dtype), a file in ``/dev/shm`` mapped by
every process of the node::

    flags    4 x L counters, one per (kind, local index), each on its own cache line
    buffers  L buffers of n values: process k leaves its part of chunk j (n / L values) for
             process j, who sums that chunk, in the buffer of distance (k - j) mod L. The two
             buffers of distance 1, used by odd and even calls in turn, are also the results:
             process j adds the other parts of chunk j into the part that process j + 1 left
             there. Distances 2 .. L-1 have one buffer each.
    weights  n values: the node's weights, where the sharded momentum update
             (:mod:`tfscale.exchange.sharded_update`) leaves them and the processes'
             variables keep them. A page of it takes memory only once written: none without
             that update.

In a buffer each tensor starts on a 64-byte boundary (the gaps stay zero), and ``n`` is a
multiple of ``L`` aligned chunks. The tensors are copied straight from TensorFlow's gradients
into the buffers, so no fused buffer is built. The results are returned as copies, or, for
gradients that the optimizer applies within the step (``copy=False``), as views of the call's
results buffer, which TensorFlow takes without copying: that buffer is written again two
calls later, after every process has finished the call in between, so after the step.

Call ``c`` (every process makes the same calls in the same order):

1. wait until every process has finished call ``c - 1`` (``gathered >= c - 1``), so no one
   still reads the buffers this process writes; copy each other process's chunk of the input
   into its buffer, all but this process's own chunk, which only it reads; publish
   ``written = c``;
2. wait until every part is written (``written >= c``); sum chunk ``j`` of the parts in local
   index order, this process's own part taken straight from its input (each chunk is summed
   by one process, so results are bit-identical everywhere), in one pass where one pass
   does it (two processes' sum), else block by block so that each block's passes find it in
   the cache (for a mean on one node, each block's sum multiplied by 1 / processes there),
   into the results buffer where the next process's part lies (a line just read is written
   without another fetch from memory); that is the reduce-scatter;
3. the all-gather: with several nodes, divide the chunk by the number of processes of the job
   for a mean (after its cross-node sum), publish ``reduced = c``, wait until every chunk is
   in (``reduced >= c``), publish ``gathered = c`` and return views of the results buffer.

Each counter has a single writer, and a counter is published after the data it stands for.
That ordering needs stores to become visible in program order (x86-64's memory model); on
other processors :func:`available` says no and the node phases stay on Horovod.

The segment's file is unlinked as soon as every process has mapped it, so nothing is left in
``/dev/shm`` once the first exchange is done, even if the job is killed later.

Local process 0 makes a segment only where the directory has room for the memory its writes
will take (the buffers, and the weights region for the sharded update's segments) besides what
the node's earlier segments are still to take, so a ``/dev/shm`` too small for it (Docker gives
containers 64 MB) is found there, with the sizes, rather than as a SIGBUS at the first write
past tmpfs's limit. Process 0 then leaves a file that holds the flags and the message in the
segment's place; the others read it there and raise the same :class:`SharedMemoryFull`. It
checks rather than reserves (``fallocate``), so that each page is still placed by the first
process that writes it (on a machine of several NUMA nodes, near that process), not all by
process 0; another job that fills ``/dev/shm`` in between is not guarded against.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import math
import mmap
import os
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

SHM_DIR = Path("/dev/shm")
_LINE = 64  # bytes: one counter per cache line, so two writers never share a line
# "attached" holds each process's pid once it has mapped the segment.
_KINDS = ("attached", "written", "reduced", "gathered")
# Spin this many checks before sleeping between checks (each check is about a microsecond).
_SPINS = 2000
_SLEEP_S = 50e-6
# While waiting, how often to check that the processes waited for are still alive.
_LIVENESS_S = 0.2
# Values summed at a time: a block of each part and of the sum stay in a core's L2 cache
# (3 x 128 KiB of float32) between the passes over it.
_BLOCK = 32 * 1024


def _alive(pid: int) -> bool:
    """Whether process ``pid`` exists and has not exited (a zombie has)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[-1].split()[0] != "Z"


def available(directory: Path = SHM_DIR) -> str:
    """Why shared memory cannot carry the node phases here, or ``""`` when it can."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return (f"this {platform.machine()} processor may reorder stores, and the exchange's "
                "flags assume x86-64's ordering")
    if not directory.is_dir() or not os.access(directory, os.W_OK):
        return f"{directory} is not a writable directory"
    return ""


class PeerTimeout(RuntimeError):
    """A process of the node did not reach the same exchange in time."""


class SharedMemoryFull(ValueError):
    """The node's shared-memory directory has too little room for a segment. A ValueError: like
    a bad flag, it is the node's configuration, which a restart does not change."""


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


class Segment:
    """The mapped segment for tensors of ``shapes`` and ``dtype`` (see the module doc)."""

    def __init__(self, path: Path, dtype: np.dtype, shapes: tuple[tuple[int, ...], ...],
                 index: int, size: int, wait: Callable[..., None], timeout_s: float,
                 weights: bool = False, pending: int = 0) -> None:
        self.index, self.size, self.shapes = index, size, shapes
        self._wait, self._timeout_s = wait, timeout_s
        per_line = _LINE // dtype.itemsize
        self.offsets = []
        length = 0
        for shape in shapes:
            self.offsets.append(length)
            length += -(-math.prod(shape) // per_line) * per_line
        length += -length % (size * per_line)
        self.length = length
        self.chunks = [slice(j * (length // size), (j + 1) * (length // size))
                       for j in range(size)]
        self.chunk = self.chunks[index]
        header = len(_KINDS) * size * _LINE
        data = length * dtype.itemsize
        count = 2 + max(size - 2, 0)
        self.weights_offset = header + count * data  # where the weights region starts
        # The memory that the segment's writes take: the weights region only where the
        # sharded update writes it (``weights``); elsewhere its pages are never touched.
        self.need = self.weights_offset + (data if weights else 0)
        self._fd: int | None = None
        what = (f"{count} buffers{' and a weights region' if weights else ''} of "
                f"{_mib(data)} ({dtype.name} gradients of {len(shapes)} tensors)")
        self._map = self._open(path, self.weights_offset + data, pending, what)
        self.flags = {
            kind: np.ndarray((size,), np.int64, self._map, offset=k * size * _LINE,
                             strides=(_LINE,))
            for k, kind in enumerate(_KINDS)}
        self.pids = self.flags["attached"]
        self.buffers = np.ndarray((count, length), dtype, self._map, offset=header)
        self.calls = 0
        # A block of a sum of three or more parts.
        self._acc = np.empty(_BLOCK if size > 2 else 0, dtype)
        self.flags["attached"][index] = os.getpid()
        if index == 0:
            # Everyone has the mapping once they all say so: the name can go.
            self._wait(self.flags["attached"], 1, f"map {path}")
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def _open(self, path: Path, total: int, pending: int, what: str) -> mmap.mmap:
        """The segment's file of ``total`` bytes, mapped; process 0 makes it where the
        directory has room for it and for the ``pending`` bytes that the node's other
        segments are still to take (``what``: the segment in words, for the error)."""
        if self.index == 0:
            # Made full-size under a temporary name, then renamed: the others never see a
            # file shorter than the segment, but for one that says why it could not be made.
            stat = os.statvfs(path.parent)
            free = stat.f_bavail * stat.f_frsize
            full = "" if self.need + pending <= free else (
                f"{path.parent} has {_mib(free)} free of {_mib(stat.f_blocks * stat.f_frsize)}"
                + (f" ({_mib(pending)} of it for this job's other segments)" if pending else "")
                + f", and the exchange of this node's {self.size} processes through it needs "
                f"{_mib(self.need)}: {what}. Give the node more shared memory (a container's "
                f"--shm-size, or a larger tmpfs on {path.parent}), or take the node's exchange "
                "off it with --node_exchange=collectives")
            temporary = path.with_name(path.name + ".new")
            fd = os.open(temporary, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
            try:
                if full:
                    body = bytes(len(_KINDS) * self.size * _LINE) + full.encode()
                    # Never the segment's size, by which the others tell the two apart.
                    os.write(fd, body + b" " * (len(body) == total))
                else:
                    os.ftruncate(fd, total)
                mapped = mmap.mmap(fd, 0)
            except BaseException:
                os.close(fd)
                raise
            if full:
                os.close(fd)
            else:
                self._fd = fd  # kept, for what the segment has taken so far (unwritten())
            temporary.rename(path)
            atexit.register(lambda: path.unlink(missing_ok=True))
            if full:
                self._fail(mapped, path, full)
            return mapped
        deadline = time.monotonic() + self._timeout_s
        while True:
            try:
                fd = os.open(path, os.O_RDWR)
                break
            except FileNotFoundError:
                if time.monotonic() > deadline:
                    raise PeerTimeout(f"shared-memory exchange: local process 0 of this node "
                                      f"did not create {path} within {self._timeout_s:g} s "
                                      "(a peer died or stalled)") from None
                time.sleep(1e-3)
        try:
            mapped = mmap.mmap(fd, 0)
        finally:
            os.close(fd)
        if len(mapped) != total:
            self._fail(mapped, path,
                       mapped[len(_KINDS) * self.size * _LINE:].decode().rstrip(" "))
        return mapped

    def _fail(self, mapped: mmap.mmap, path: Path, message: str) -> None:
        """Raises :class:`SharedMemoryFull` with ``message`` on every process of the node, once
        each has read it in the file that stands in the segment's place (process 0 waits for
        that, then removes the file)."""
        attached = np.ndarray((self.size,), np.int64, mapped, strides=(_LINE,),
                              offset=_KINDS.index("attached") * self.size * _LINE)
        attached[self.index] = os.getpid()
        if self.index == 0:
            self._wait(attached, 1, f"read why {path} could not be made")
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        raise SharedMemoryFull(message)

    def unwritten(self) -> int:
        """Bytes of the segment's memory that its first writes are still to take (tmpfs
        gives a file its pages as they are written); 0 but on local process 0, which made
        the file."""
        if self._fd is None:
            return 0
        return max(0, self.need - os.fstat(self._fd).st_blocks * 512)

    @property
    def weights(self) -> np.ndarray:
        """The weights region, as the buffers lay out the tensors."""
        return np.ndarray((self.length,), self.buffers.dtype, self._map,
                          offset=self.weights_offset)

    @property
    def address(self) -> int:
        """Where the mapping starts in this process's memory (for the native op)."""
        return int(self.flags["attached"].ctypes.data)

    def _views(self, flat: np.ndarray) -> list[np.ndarray]:
        return [flat[o:o + math.prod(s)].reshape(s)
                for o, s in zip(self.offsets, self.shapes, strict=True)]

    def _buffer(self, distance: int, call: int) -> np.ndarray:
        """The buffer where process ``k`` leaves its part of chunk ``j`` for process ``j`` to
        sum, ``distance`` = (k - j) mod L; distance 1, the results, by ``call``'s parity."""
        return self.buffers[call % 2 if distance == 1 else distance]

    def reduce_scatter(self, tensors: Sequence[np.ndarray], scale: float = 1.0) -> np.ndarray:
        """Steps 1 and 2: the node's sum of this process's chunk of the tensors laid out in a
        buffer, left in the call's results buffer (and returned as a view of it). ``scale``
        multiplies each block of the sum while it is in the cache: a mean without a pass of
        its own over the result. The parts are copied in unscaled: a plain copy (``memcpy``)
        costs less than a multiplication into the same buffer (bench/RESULTS.md)."""
        # The call's number, one more than the last this process finished: shared with
        # :mod:`tfscale.exchange.native`'s op, which may make the calls on the same segment.
        c = self.calls = int(self.flags["gathered"][self.index]) + 1
        self._wait(self.flags["gathered"], c - 1, f"finish exchange {c - 1}", self.pids)
        flat = [np.asarray(t).reshape(-1) for t in tensors]
        # Only the chunks the other processes sum are copied: this process sums its own chunk
        # straight from its tensors (half the copying in, for two processes).
        for j in range(self.size):
            if j != self.index:
                into = self._buffer((self.index - j) % self.size, c)
                for start, end, offset, tensor in self._pieces(flat, self.chunks[j]):
                    np.copyto(into[start:end], tensor[start - offset:end - offset])
        self.flags["written"][self.index] = c
        self._wait(self.flags["written"], c, f"write its tensors for exchange {c}", self.pids)
        for start, end, offset, tensor in self._pieces(flat, self.chunk):
            self._sum(tensor[start - offset:end - offset], start, c, scale)
        return self._buffer(1, c)[self.chunk]

    def _sum(self, mine: np.ndarray, start: int, call: int, scale: float) -> None:
        """Sums buffer range ``start``.. over the processes in local index order and
        multiplies the sum by ``scale``, into the results buffer, where the next process's
        part already lies: this process's own part is ``mine``, the others' are in their
        buffers. Adding into the part just read, rather than into a buffer last touched two
        calls ago, spares the memory the fetch of every line of the sum before it is written.
        Where that takes several passes (a scale, or three or more parts), block by block, so
        that a block's passes find it in the cache; a single pass (one process, or two and no
        scale: the sum that both strategies run) goes over the range at once, since blocks
        would only add a Python iteration each (bench/RESULTS.md). Two parts may be added
        either way round (addition is commutative, bit for bit); three or more are added in
        local index order in a scratch block, then stored."""
        size, index = self.size, self.index
        total = self._buffer(1, call)[start:start + mine.size]
        if size == 1:
            np.multiply(mine, scale, out=total)
            return
        if size == 2 and scale == 1.0:
            total += mine
            return
        parts = [None if k == index else
                 self._buffer((k - index) % size, call)[start:start + mine.size]
                 for k in range(size)]
        for lo in range(0, mine.size, _BLOCK):
            hi = min(lo + _BLOCK, mine.size)
            own, out = mine[lo:hi], total[lo:hi]
            if size == 2:
                out += own
                out *= scale
            else:
                acc = self._acc[:hi - lo]
                blocks = [own if part is None else part[lo:hi] for part in parts]
                np.add(blocks[0], blocks[1], out=acc)
                for block in blocks[2:]:
                    acc += block
                if scale != 1.0:
                    acc *= scale
                np.copyto(out, acc)

    def _pieces(self, flat: Sequence[np.ndarray], chunk: slice,
                ) -> Iterator[tuple[int, int, int, np.ndarray]]:
        """(start, end, offset, tensor): the buffer ranges of ``flat``'s tensors inside
        ``chunk``, with each tensor's offset in the buffer."""
        for offset, tensor in zip(self.offsets, flat, strict=True):
            lo, hi = max(offset, chunk.start), min(offset + tensor.size, chunk.stop)
            if lo < hi:
                yield lo, hi, offset, tensor

    def all_gather(self, divisor: int, chunk: np.ndarray | None = None,
                   copy: bool = True) -> list[np.ndarray]:
        """Step 3: the tensors' sums from every process's chunk, divided by ``divisor``.
        ``chunk`` replaces this process's chunk of the results (with its cross-node sum).
        ``copy=False`` returns views of the results buffer, written again two calls later."""
        c = self.calls
        results = self._buffer(1, c)
        total = results[self.chunk]
        if divisor != 1:
            np.divide(total if chunk is None else chunk, divisor, out=total)
        elif chunk is not None:
            np.copyto(total, chunk)
        self.flags["reduced"][self.index] = c
        self._wait(self.flags["reduced"], c, f"write its chunk for exchange {c}", self.pids)
        views = self._views(results)
        if copy:
            views = [v.copy() for v in views]
        self.flags["gathered"][self.index] = c
        return views


class SharedMemoryGroup:
    """The node phases of the hierarchical all-reduce, through shared memory.

    Each call takes a list of tensors of one dtype as NumPy arrays (what ``tf.numpy_function``
    passes); every process of the node makes the same calls, with the same shapes, in the same
    order.

    Args:
        key: the same on every process of the node and unique to the job and node (a token
            from the job's rank 0 and the node's index).
        index: this process's local index on the node.
        size: processes on the node.
        timeout_s: how long to wait for the other processes before raising
            :class:`PeerTimeout` (a peer that died or stalled).
        directory: where the segments' files are made (``/dev/shm``).
        ranks: each local index's rank in the job, for error messages (default: the local
            indices themselves).
    """

    def __init__(self, key: str, index: int, size: int, timeout_s: float = 600.0,
                 directory: Path = SHM_DIR, ranks: Sequence[int] = ()) -> None:
        self.key, self.index, self.size, self.timeout_s = key, index, size, timeout_s
        self.ranks = tuple(ranks) or tuple(range(size))
        self.directory = directory
        self._segments: dict[tuple[object, ...], Segment] = {}
        self._full: dict[tuple[object, ...], str] = {}  # segments that did not fit: why
        self._last: Segment | None = None

    def _segment(self, tensors: Sequence[np.ndarray]) -> Segment:
        dtype = tensors[0].dtype
        if any(t.dtype != dtype for t in tensors):
            raise ValueError(f"one exchange takes tensors of one dtype, not "
                             f"{sorted({t.dtype.name for t in tensors})}")
        return self.segment(dtype, tuple(tuple(t.shape) for t in tensors))

    def segment(self, dtype: np.dtype, shapes: tuple[tuple[int, ...], ...],
                owner: str = "") -> Segment:
        """The segment for calls on tensors of ``shapes`` and ``dtype``, made and mapped by
        every process of the node on first use (each waits for the others there). An
        ``owner`` (the same on every process) gets a segment of its own, whose weights region
        counts in the room it needs: the sharded update keeps one model's weights there.

        Raises:
            SharedMemoryFull: where the directory cannot hold the segment, on every process
                of the node (and again at every later call for it).
        """
        dtype = np.dtype(dtype)
        key = (dtype.name, shapes, owner) if owner else (dtype.name, shapes)
        if key in self._full:
            raise SharedMemoryFull(self._full[key])
        if key not in self._segments:
            # Named by what it carries, not by the order of first use (the native op's segment
            # is made when the step is traced): a process that came to its segments in another
            # order than its peers would wait for the right one, and time out saying so,
            # rather than map one made for other tensors.
            digest = hashlib.sha256(repr(key).encode()).hexdigest()[:16]
            path = self.directory / f"tfscale-{self.key}-{digest}"
            try:
                pending = sum(segment.unwritten() for segment in self._segments.values())
                self._segments[key] = Segment(path, dtype, shapes, self.index, self.size,
                                              self._wait, self.timeout_s, weights=bool(owner),
                                              pending=pending)
            except SharedMemoryFull as err:
                # Not made again: every process must come to the same segments.
                self._full[key] = str(err)
                raise
        return self._segments[key]

    def _wait(self, flags: np.ndarray, value: int, what: str,
              pids: np.ndarray | None = None) -> None:
        """Returns once every process's counter in ``flags`` is at least ``value``.

        Raises:
            PeerTimeout: after ``timeout_s``, or as soon as a process waited for has exited
                (``pids``: the segment's pids, once all are attached).
        """
        spins = 0
        deadline = check = 0.0
        while True:
            behind = np.flatnonzero(flags < value)
            if not behind.size:
                return
            spins += 1
            if spins < _SPINS:
                # Hands the core to a peer that shares it (more processes than cores: a
                # spinning wait would hold it until preempted, milliseconds later); returns at
                # once when no other process is waiting for this core.
                os.sched_yield()
                continue
            now = time.monotonic()
            if not deadline:
                deadline, check = now + self.timeout_s, now + _LIVENESS_S
            elif now > deadline:
                raise PeerTimeout(
                    f"shared-memory exchange: {self._who(behind)} of this node did not {what} "
                    f"within {self.timeout_s:g} s (a peer died or stalled)")
            elif pids is not None and now > check:
                check = now + _LIVENESS_S
                gone = [int(i) for i in behind if not _alive(int(pids[i]))]
                if gone:
                    raise PeerTimeout(
                        f"shared-memory exchange: {self._who(gone)} of this node (pid "
                        f"{', '.join(str(int(pids[i])) for i in gone)}) exited before they "
                        f"could {what} (a peer died)")
            time.sleep(_SLEEP_S)

    def _who(self, indices: Sequence[int] | np.ndarray) -> str:
        """"rank(s) [3] (local process(es) [1])": the job's ranks of local ``indices``."""
        local = [int(i) for i in indices]
        return f"rank(s) {[self.ranks[i] for i in local]} (local process(es) {local})"

    def reduce_scatter(self, *tensors: np.ndarray) -> np.ndarray:
        """Chunk ``index`` of the node's sum of ``tensors`` laid out in one buffer (a copy);
        pass the chunk's cross-node sum to :meth:`all_gather`."""
        self._last = self._segment(tensors)
        return self._last.reduce_scatter(tensors).copy()

    def all_gather(self, chunk: np.ndarray, divisor: int = 1,
                   copy: bool = True) -> list[np.ndarray]:
        """The tensors of the :meth:`reduce_scatter` just made, summed over the chunks
        gathered from the node's processes and divided by ``divisor``; ``copy=False``: views
        of a buffer that the call after next overwrites."""
        if self._last is None:
            raise RuntimeError("all_gather pairs with the reduce_scatter before it; none was made")
        segment, self._last = self._last, None
        return segment.all_gather(divisor, chunk, copy)

    def gather(self, values: np.ndarray) -> np.ndarray:
        """Every process's ``values`` (1-D) as the rows of a (size, n) array, in local index
        order: the node's sum of arrays that hold each process's values in its own row and
        zeros in the others. Adding zeros is exact, so each row arrives as it was sent (NaN
        and infinities included), and host collectives of any reduction are built on it."""
        rows = np.zeros((self.size, values.size), values.dtype)
        rows[self.index] = values
        return self._all_reduce((rows,))[0]

    def all_reduce(self, *tensors: np.ndarray, divisor: int = 1,
                   copy: bool = True) -> list[np.ndarray]:
        """The node's sums of ``tensors``, divided by ``divisor``; ``copy=False``: views of a
        buffer that the call after next overwrites."""
        return self._all_reduce(tensors, divisor, copy)

    def _all_reduce(self, tensors: Sequence[np.ndarray], divisor: int = 1,
                    copy: bool = True) -> list[np.ndarray]:
        segment = self._segment(tensors)
        # The mean's division is done on each block of the sum while it is in the cache,
        # rather than in a pass of its own over the chunk.
        segment.reduce_scatter(tensors, 1.0 / divisor)
        return segment.all_gather(1, copy=copy)
