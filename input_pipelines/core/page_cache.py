"""The page cache and raw reads: what a cold read of a dataset's files costs.

:func:`drop_cache` asks the kernel to forget files (``posix_fadvise(POSIX_FADV_DONTNEED)``,
which needs no root) and measures with ``mincore`` how much of them stayed cached: pages that a
process maps (an open LMDB environment maps ``data.mdb``), dirty pages, or a filesystem that
ignores the advice keep a "cold" read warm, and the caller should say so.
:func:`read_bandwidth` reads files with plain 1 MiB reads by several threads at once.
"""

from __future__ import annotations

import ctypes
import os
import threading
import time
from collections.abc import Sequence
from typing import Any

CHUNK = 2**20  # bytes per read, and per piece of a file dealt to a reader
MB = 1e6


def _libc() -> Any:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    return libc


def cached_bytes(path: str) -> int | None:
    """Bytes of ``path`` in the page cache (``mincore``), or None where that cannot be asked."""
    size = os.path.getsize(path)
    if size == 0:
        return 0
    try:
        libc = _libc()
    except (OSError, AttributeError):
        return None
    page = os.sysconf("SC_PAGE_SIZE")
    fd = os.open(path, os.O_RDONLY)
    try:
        address = libc.mmap(None, size, 1, 1, fd, 0)  # PROT_READ, MAP_SHARED
        if address in (None, ctypes.c_void_p(-1).value):
            return None
        try:
            pages = ctypes.create_string_buffer(-(-size // page))
            if libc.mincore(address, size, pages) != 0:
                return None
            return min(size, sum(b & 1 for b in pages.raw) * page)
        finally:
            libc.munmap(address, size)
    finally:
        os.close(fd)


def drop_cache(paths: Sequence[str]) -> float | None:
    """Asks the kernel to drop ``paths`` from the page cache; returns the share of their bytes
    still cached afterwards (None when unknown): pages another process maps, or a filesystem
    that ignores the advice, stay."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fdatasync(fd)  # dirty pages are not dropped
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        except (OSError, AttributeError):
            pass
        finally:
            os.close(fd)
    cached = [cached_bytes(p) for p in paths]
    total = sum(os.path.getsize(p) for p in paths)
    if any(c is None for c in cached) or total == 0:
        return None
    return sum(c or 0 for c in cached) / total


def read_bandwidth(paths: Sequence[str], readers: int) -> float:
    """MB/s of ``readers`` threads reading every byte of ``paths`` once, in 1 MiB pieces
    dealt round-robin (so one big file is read in parallel too)."""
    pieces = [(p, offset) for p in paths for offset in range(0, os.path.getsize(p), CHUNK)]
    total = sum(os.path.getsize(p) for p in paths)

    def read(mine: Sequence[tuple[str, int]]) -> None:
        buffer = bytearray(CHUNK)
        for path, offset in mine:
            with open(path, "rb", buffering=0) as f:
                f.seek(offset)
                f.readinto(buffer)

    threads = [threading.Thread(target=read, args=(pieces[i::readers],))
               for i in range(readers)]
    start = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return total / MB / (time.perf_counter() - start)
