"""Helpers for fault-injection tests: long-running training processes, signals, cleanup."""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from tests.conftest import ROOT, TINY

TRAIN = [sys.executable, "-m", "tfscale.train"]


def long_run_flags(model_dir: Path, strategy: str, *extra: str) -> list[str]:
    return [*TINY, f"--strategy={strategy}", "--steps=100000", "--log_every=50",
            f"--model_dir={model_dir}", *extra]


@contextmanager
def started(command: list[str], env: dict[str, str] | None = None,
            log: Path | None = None, out: int | None = None,
            ) -> Iterator[subprocess.Popen[str]]:
    """Starts ``command`` in its own session, its output into ``log`` or the file descriptor
    ``out`` (else discarded); on exit kills whatever of its group is left."""
    sink = open(log, "w") if log else subprocess.DEVNULL if out is None else out  # noqa: SIM115
    proc = subprocess.Popen(command, cwd=ROOT, env={**os.environ, **(env or {})}, text=True,
                            stdout=sink, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        kill_group(proc)
        if log:
            sink.close()  # type: ignore[union-attr]


@contextmanager
def output_bound(capacity: int = 16384) -> Iterator[tuple[int, int]]:
    """A pipe (read end, write end) that holds ``capacity`` bytes and that nobody reads: a
    process writing its output into it unbuffered blocks at the write after that much, so a
    run that logs every step cannot get further than ``capacity`` bytes of output past the
    point where it started. That bounds how far a run goes before a test kills it, at any
    CPU speed. The read end gives what was written (:func:`drained`)."""
    read, write = os.pipe()
    try:
        granted = fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, capacity)
        assert granted == capacity, f"the pipe holds {granted} bytes, not {capacity}"
        os.set_blocking(read, False)
        yield read, write
    finally:
        os.close(read)
        os.close(write)


def drained(fd: int) -> str:
    """What the pipe's read end ``fd`` holds now (it is non-blocking)."""
    chunks = []
    while True:
        try:
            chunk = os.read(fd, 65536)
        except BlockingIOError:
            break
        if not chunk:
            break
        chunks.append(chunk)
    return b"".join(chunks).decode(errors="replace")


def kill_group(proc: subprocess.Popen[Any]) -> None:
    """SIGKILLs ``proc``'s process group (if any is left) and reaps ``proc``."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.05)


def worker_pids(marker: str) -> dict[int, int]:
    """rank -> pid of the tfscale.train workers whose command line contains ``marker``."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if "tfscale.train" not in cmdline or marker not in cmdline:
            continue
        env = dict(e.decode().split("=", 1) for e in environ if b"=" in e)
        if "TFSCALE_LAUNCHED" in env:
            rank = env.get("HOROVOD_RANK") or _tf_config_index(env.get("TF_CONFIG", ""))
            found[int(rank)] = int(entry.name)
    return found


def _tf_config_index(text: str) -> str:
    import json

    return str(json.loads(text)["task"]["index"]) if text else "0"


def progress(log: Path, step: int) -> Callable[[], bool]:
    """True once the chief has printed ``step N`` for some N >= ``step``."""

    def reached() -> bool:
        text = log.read_text() if log.exists() else ""
        steps = [int(w.split("/")[0]) for w in text.split("step ")[1:]
                 if w.split("/")[0].isdigit()]
        return bool(steps) and max(steps) >= step

    return reached
