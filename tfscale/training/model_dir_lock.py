"""One run writes a model_dir at a time: a lock file that names its holder.

Two runs into one model_dir (two jobs, or ranks of a launcher that each ran a single-process
strategy) would overwrite each other's checkpoints and results without a word. The chief of a
run creates ``MODEL_DIR/run.lock`` (exclusively) before training and removes it when the run
ends, however it ends short of being killed. A second run fails at once, naming the holder's
host and pid. A lock left by a killed run is taken over when its holder is provably gone: same
host, and the pid is not running, or is another process than the one that took it (pids are
reused; the kernel's start time of the process tells them apart). On another host nothing can
be proved, so the message says which file to remove.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from pathlib import Path
from typing import Any

LOCK = "run.lock"


def process_start(pid: int) -> str | None:
    """The kernel's start time of process ``pid`` (clock ticks after boot, field 22 of
    ``/proc/PID/stat``), or None when no such process is running (a zombie is not running:
    ``kill -0`` would still find it)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()  # after the command name, which may hold spaces
    return None if fields[0] in ("Z", "X") else fields[19]


def _me() -> dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(),
            "start": process_start(os.getpid()), "since": time.time()}


def _stale(holder: dict[str, Any]) -> bool:
    """Whether the run that wrote ``holder`` is provably gone."""
    if holder.get("host") != socket.gethostname():
        return False
    start = process_start(int(holder.get("pid", 0)))
    return start is None or start != holder.get("start")


def _read(path: Path) -> dict[str, Any] | None:
    try:
        holder = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return holder if isinstance(holder, dict) and "pid" in holder else None


def acquire(model_dir: str | os.PathLike[str]) -> Path:
    """Takes the lock of ``model_dir`` for this process (creating the folder).

    Returns:
        The lock file, for :func:`release`.

    Raises:
        ValueError: another live run (or one on another host) holds it, naming its host, pid
            and start, and the file to remove if that run is gone.
    """
    path = Path(model_dir) / LOCK
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            holder = _read(path)
            if holder is not None and _stale(holder):
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                continue
            raise ValueError(_held_message(model_dir, path, holder)) from None
        with os.fdopen(fd, "w") as f:
            json.dump(_me(), f)
        return path


def _held_message(model_dir: str | os.PathLike[str], path: Path,
                  holder: dict[str, Any] | None) -> str:
    if holder is None:
        who = "a run whose lock names no holder"
    else:
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(holder.get("since", 0))))
        who = f"the run of pid {holder['pid']} on host {holder.get('host')} (since {since})"
    return (f"--model_dir={model_dir} is in use by {who}; wait for it to end or give another "
            f"--model_dir (if no run uses it any more, remove {path})")


def release(path: Path) -> None:
    """Removes the lock at ``path`` if this process holds it."""
    holder = _read(path)
    if holder is not None and holder["pid"] == os.getpid() \
            and holder.get("host") == socket.gethostname():
        path.unlink(missing_ok=True)

