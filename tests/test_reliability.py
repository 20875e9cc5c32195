"""Fault injection with real processes and signals; one test per row of docs/RELIABILITY.md."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, TINY, read_results, requires_horovod, run_process, run_train
from tests.faults import (
    TRAIN,
    drained,
    kill_group,
    long_run_flags,
    output_bound,
    progress,
    started,
    wait_for,
    worker_pids,
)
from tfscale.scripts.launcher import horovod_envs, tf_config_envs
from tfscale.training.checkpointing import CheckpointManager
from tfscale.training.events import read_events

pytestmark = pytest.mark.slow
MULTI = [pytest.param("horovod", marks=requires_horovod),
         pytest.param("ddl", marks=requires_horovod), "multiworker"]


@pytest.mark.parametrize("strategy", MULTI)
def test_killed_worker_stops_the_launcher_without_orphans(strategy: str, tmp_path: Path) -> None:
    log = tmp_path / "log"
    flags = long_run_flags(tmp_path / "run", strategy, "--num_processes=2")
    with started([*TRAIN, *flags], log=log) as launcher:
        wait_for(progress(log, 50), 120, "training to start")
        pids = worker_pids(str(tmp_path))
        assert sorted(pids) == [0, 1]
        os.kill(pids[1], signal.SIGKILL)
        killed_at = time.monotonic()
        code = launcher.wait(timeout=60)
        assert time.monotonic() - killed_at < 60
    assert code != 0
    assert "worker 1 was killed by SIGKILL" in log.read_text()
    wait_for(lambda: not worker_pids(str(tmp_path)), 10, "no worker left behind")


@contextmanager
def _pair(strategy: str, flags: list[str], tmp_path: Path, chief_out: int | None = None,
          ) -> Iterator[tuple[list[subprocess.Popen[bytes]], list[Path]]]:
    """Two workers started directly (no tfscale launcher supervising them), each with its own
    log, or rank 0 writing into the file descriptor ``chief_out`` (unbuffered). On exit, both
    process groups are killed and Horovod's rendezvous server is stopped."""
    envs, server = (horovod_envs([("localhost", 2)]) if strategy in ("horovod", "ddl")
                    else (tf_config_envs(2), None))
    procs: list[subprocess.Popen[bytes]] = []
    logs = [tmp_path / f"rank{rank}.log" for rank in range(len(envs))]
    try:
        for rank, env in enumerate(envs):
            with open(logs[rank], "w") as log:
                out = log.fileno() if rank or chief_out is None else chief_out
                procs.append(subprocess.Popen(
                    [*TRAIN, *flags], cwd=ROOT, stdout=out, stderr=subprocess.STDOUT,
                    env={**os.environ, **env, "TFSCALE_LAUNCHED": "1", "PYTHONUNBUFFERED": "1"},
                    start_new_session=True))
        yield procs, logs
    finally:
        for proc in procs:
            kill_group(proc)
        if server is not None:
            server.stop()


@pytest.mark.parametrize("fault", ["SIGKILL", "SIGSTOP"])
@pytest.mark.parametrize("strategy", MULTI)
def test_surviving_worker_reports_lost_peer(strategy: str, fault: str, tmp_path: Path) -> None:
    flags = long_run_flags(tmp_path / "run", strategy, "--num_processes=2",
                           "--collective_timeout_s=10")
    with _pair(strategy, flags, tmp_path) as (procs, logs):
        wait_for(progress(logs[0], 50), 120, "training to start")
        os.kill(procs[1].pid, getattr(signal, fault))
        code = procs[0].wait(timeout=60)
    text = logs[0].read_text()
    assert code == 4, text[-2000:]
    assert "error: lost contact with" in text
    if strategy == "multiworker":
        assert "worker 1" in text


@pytest.mark.parametrize("strategy", [pytest.param("horovod", marks=requires_horovod),
                                      "default"])
def test_preemption_checkpoints_and_resumes(strategy: str, tmp_path: Path) -> None:
    log, run = tmp_path / "log", tmp_path / "run"
    extra = ["--num_processes=2"] if strategy == "horovod" else []
    flags = [*TINY, f"--strategy={strategy}", "--steps=100000", "--log_every=50",
             f"--model_dir={run}", *extra]
    with started([*TRAIN, *flags], log=log) as proc:
        wait_for(progress(log, 100), 120, "training to start")
        proc.send_signal(signal.SIGUSR1 if strategy == "default" else signal.SIGTERM)
        code = proc.wait(timeout=60)
    text = log.read_text()
    assert code == 75, text[-2000:]
    assert "preempted by a signal at step" in text
    stopped = CheckpointManager(run / "checkpoints").steps()[0]
    assert stopped >= 100
    assert read_events(run / "events.jsonl")[-1] == {
        **read_events(run / "events.jsonl")[-1], "event": "run_stop", "status": "preempted",
        "step": stopped}
    again = run_train(*TINY, f"--strategy={strategy}", f"--steps={stopped + 5}",
                      f"--model_dir={run}", *extra)
    assert again.returncode == 0, again.stdout[-2000:] + again.stderr[-2000:]
    assert f"steps {stopped}->{stopped + 5}" in again.stdout
    assert read_results(run)["steps"] == stopped + 5


@pytest.mark.parametrize(("strategy", "extra"), [
    ("default", []),
    # Plain horovod x 2 killed and resumed to the same weights is test_restart's case (a
    # worker killed, the group restarted by --max_restarts). The lag's pending gradients are
    # checkpointed (averaged over the workers), so the first step after resuming applies what
    # it would have applied without the kill.
    pytest.param("horovod", ["--gradient_lag=1"], marks=requires_horovod),
])
def test_killed_run_resumes_to_identical_weights(strategy: str, extra: list[str],
                                                 tmp_path: Path) -> None:
    """Killed (SIGKILL, every process) once its first checkpoint is on disk, the run resumes
    from its latest checkpoint and ends with the weights of a run that was never killed.

    The kill lands before the run's end at any CPU speed: the chief logs every step into a
    16 KiB pipe that nobody reads (tests.faults.output_bound), so it blocks after about a
    hundred steps of output and cannot reach step 300."""
    steps = 300
    flags = [*TINY, f"--strategy={strategy}", f"--steps={steps}", "--deterministic",
             "--checkpoint_every=10", "--epochs=3", *extra]
    if strategy == "horovod":
        flags.append("--num_processes=2")
    killed, full = tmp_path / "killed", tmp_path / "full"
    manager = CheckpointManager(killed / "checkpoints")
    with output_bound() as (held, chief_out):
        if strategy == "default":
            with started([*TRAIN, *flags, f"--model_dir={killed}"],
                         env={"PYTHONUNBUFFERED": "1"}, out=chief_out):
                wait_for(lambda: bool(manager.steps()), 120, "a first checkpoint")
        else:
            with _pair(strategy, [*flags, f"--model_dir={killed}"], tmp_path, chief_out):
                wait_for(lambda: bool(manager.steps()), 120, "a first checkpoint")
        output = drained(held)
    last = manager.steps()[0]  # the newest
    assert 10 <= last < steps, output[-2000:]
    resumed = run_train(*flags, f"--model_dir={killed}", timeout=300)
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert f"steps {last}->{steps}" in resumed.stdout, resumed.stdout[-2000:]
    assert run_train(*flags, f"--model_dir={full}", timeout=300).returncode == 0
    a = CheckpointManager(killed / "checkpoints").read(steps)[1]
    b = CheckpointManager(full / "checkpoints").read(steps)[1]
    assert max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True)) < 1e-6


def test_non_finite_loss_stops_and_keeps_last_good_checkpoint(tmp_path: Path) -> None:
    good = run_train(*TINY, "--steps=5", f"--model_dir={tmp_path}")
    assert good.returncode == 0
    bad = run_train(*TINY, "--steps=50", "--checkpoint_every=1", "--learning_rate=1e30",
                    "--allow_config_change",
                    f"--model_dir={tmp_path}")
    assert bad.returncode == 3, bad.stderr[-2000:]
    match = re.search(r"error: loss became NaN/Inf at step (\d+); stopped without saving it\. "
                      r"Last good checkpoint: step (\d+)", bad.stderr)
    assert match, bad.stderr
    stopped_at, kept = int(match[1]), int(match[2])
    manager = CheckpointManager(tmp_path / "checkpoints")
    assert 5 <= kept < stopped_at and manager.steps()[0] == kept
    stops = [(e["status"], e["step"]) for e in read_events(tmp_path / "events.jsonl")
             if e["event"] == "run_stop"]
    assert stops == [("success", 5), ("non_finite", stopped_at)]  # appended by the second run
    for step in manager.steps():
        assert all(np.all(np.isfinite(a)) for a in manager.read(step)[1] if a.dtype.kind == "f")


def test_corrupt_latest_checkpoint_falls_back_through_the_cli(tmp_path: Path) -> None:
    assert run_train(*TINY, "--steps=4", "--checkpoint_every=2",
                     f"--model_dir={tmp_path}").returncode == 0
    latest = CheckpointManager(tmp_path / "checkpoints").path(4)
    latest.write_bytes(latest.read_bytes()[:100])
    proc = run_train(*TINY, "--steps=6", f"--model_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert f"checkpoint {latest} is unreadable" in proc.stderr
    assert "steps 2->6" in proc.stdout


FULL_DISK = """
import resource, signal, sys
import keras, numpy as np
from tfscale.training.checkpointing import CheckpointManager
manager = CheckpointManager(sys.argv[1])
variables = [keras.Variable(np.ones((64, 64), "float32"))]
manager.save(1, variables)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
variables[0].assign(np.full((64, 64), 2.0, "float32"))
try:
    manager.save(2, variables)
except OSError as err:
    print("write failed:", err)
    sys.exit(0)
sys.exit("the oversized write unexpectedly succeeded")
"""


def test_full_disk_during_checkpoint_keeps_previous(tmp_path: Path) -> None:
    proc = run_process([sys.executable, "-c", FULL_DISK, str(tmp_path)], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "write failed" in proc.stdout and "File too large" in proc.stdout
    manager = CheckpointManager(tmp_path)
    assert manager.steps() == [1] and not list(tmp_path.glob(".*tmp*"))
    assert np.all(manager.read(1)[1][0] == 1.0)


def test_missing_horovod_is_reported_before_any_worker_starts(tmp_path: Path) -> None:
    fake = tmp_path / "site" / "horovod"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text("raise ImportError('horovod is not installed')\n")
    proc = run_train(*TINY, "--strategy=horovod", "--num_processes=2", "--steps=1",
                     f"--model_dir={tmp_path / 'run'}",
                     env={"PYTHONPATH": f"{tmp_path / 'site'}:{ROOT}"})
    assert proc.returncode == 2
    assert "Horovod is not importable" in proc.stderr and "launch/setup.sh" in proc.stderr
    assert "[0]" not in proc.stdout and not (tmp_path / "run").exists()
