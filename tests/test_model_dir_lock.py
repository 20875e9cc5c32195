"""One run per model_dir (tfscale/training/model_dir_lock.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import TINY, requires_horovod, run_train
from tfscale.training.model_dir_lock import LOCK, acquire, process_start, release


def _held_by(model_dir: Path, pid: int, host: str = "") -> None:
    model_dir.mkdir(parents=True, exist_ok=True)
    (model_dir / LOCK).write_text(json.dumps({
        "host": host or socket.gethostname(), "pid": pid, "start": process_start(pid),
        "since": 0.0}))


def test_lock_is_taken_and_released(tmp_path: Path) -> None:
    path = acquire(tmp_path / "run")
    assert json.loads(path.read_text())["pid"] == os.getpid()
    release(path)
    assert not path.exists()


def test_a_second_run_fails_at_once_naming_the_holder(tmp_path: Path) -> None:
    holder = subprocess.Popen(["sleep", "30"])
    try:
        _held_by(tmp_path, holder.pid)
        with pytest.raises(ValueError, match=rf"--model_dir={tmp_path} is in use by the run of "
                                             rf"pid {holder.pid} on host "
                                             rf"{socket.gethostname()} \(since "):
            acquire(tmp_path)
    finally:
        holder.kill()
        holder.wait()
    # Its holder gone (same host, pid not running), the lock is stale and taken over.
    path = acquire(tmp_path)
    assert json.loads(path.read_text())["pid"] == os.getpid()


def test_a_reused_pid_or_another_host_is_told_apart(tmp_path: Path) -> None:
    # This process's pid, with another start time: a process that reused the pid of the holder.
    _held_by(tmp_path, os.getppid())
    lock = json.loads((tmp_path / LOCK).read_text())
    (tmp_path / LOCK).write_text(json.dumps({**lock, "start": "1"}))
    assert json.loads(acquire(tmp_path).read_text())["pid"] == os.getpid()
    # On another host nothing can be proved: the message says which file to remove.
    _held_by(tmp_path, 1, host="elsewhere")
    with pytest.raises(ValueError, match=f"pid 1 on host elsewhere .*remove {tmp_path}/{LOCK}"):
        acquire(tmp_path)


@requires_horovod
def test_workers_stop_together_when_the_chief_cannot_take_the_model_dir(tmp_path: Path) -> None:
    holder = subprocess.Popen(["sleep", "120"])
    try:
        _held_by(tmp_path, holder.pid)
        proc = run_train(*TINY, "--strategy=horovod", "--num_processes=2", "--steps=2",
                         f"--model_dir={tmp_path}", timeout=180)
    finally:
        holder.kill()
        holder.wait()
    assert proc.returncode == 2, proc.stdout[-3000:]
    errors = sorted(line for line in proc.stdout.splitlines() if "error:" in line)
    assert len(errors) == 2, proc.stdout
    assert errors[0].startswith(f"[0] error: --model_dir={tmp_path} is in use by the run of pid "
                                f"{holder.pid} on host {socket.gethostname()} (since "), errors
    assert errors[0].endswith(f"(if no run uses it any more, remove {tmp_path}/{LOCK})"), errors
    assert errors[1] == "[1] error: the chief could not take --model_dir (see its error)"
