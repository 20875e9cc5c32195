"""``tfscale-run`` (tfscale/cli/run.py) with a plain script that only reports what it was given:
the workers' variables, rank prefixes, a failing worker, restarts, forwarded signals, the
cluster-launcher mode and bad usage. Each run takes about a second (no TensorFlow)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT, requires_horovod, run_process
from tests.faults import kill_group, wait_for
from tfscale.cli import run

PROBE = ROOT / "tests" / "workers" / "run_probe.py"
ENV = {"PYTHONPATH": str(ROOT)}


def tfscale_run(cwd: Path, *args: str, env: dict[str, str] | None = None,
                ) -> subprocess.CompletedProcess[str]:
    """``python -m tfscale.run ARGS`` from ``cwd``, with the probe given relative to it."""
    probe = os.path.relpath(PROBE, cwd)
    argv = [a.replace("PROBE", probe) for a in args]
    return run_process([sys.executable, "-m", "tfscale.run", *argv], timeout=120,
                       env={**ENV, **(env or {})}, cwd=cwd)


def seen(stdout: str) -> dict[int, dict[str, Any]]:
    """rank -> the probe's report, from the rank-prefixed lines."""
    found = {}
    for line in stdout.splitlines():
        prefix, _, rest = line.partition(" seen ")
        if rest:
            found[int(prefix.strip("[]"))] = json.loads(rest)
    return found


@pytest.mark.parametrize("strategy", [pytest.param("horovod", marks=requires_horovod),
                                      "multiworker"])
def test_workers_get_what_their_strategy_needs(strategy: str, tmp_path: Path) -> None:
    proc = tfscale_run(tmp_path, "--nproc=2", f"--strategy={strategy}", "PROBE", "--lr", "0.1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ranks = seen(proc.stdout)
    assert sorted(ranks) == [0, 1]
    for rank, report in ranks.items():
        assert report["TFSCALE_STRATEGY"] == strategy and report["TFSCALE_RESTART"] == "0"
        assert report["TFSCALE_LAUNCHED"] == "1"
        assert (report["TFSCALE_LOCAL_RANK"], report["TFSCALE_LOCAL_SIZE"]) == (str(rank), "2")
        assert report["args"] == ["--lr", "0.1"]
        if strategy == "horovod":
            assert (report["HOROVOD_RANK"], report["HOROVOD_SIZE"]) == (str(rank), "2")
            assert report["rendezvous"] is True and report["TF_CONFIG"] is None
        else:
            spec = json.loads(report["TF_CONFIG"])
            assert spec["task"] == {"type": "worker", "index": rank}
            assert spec["cluster"] == json.loads(ranks[0]["TF_CONFIG"])["cluster"]
            assert len(set(spec["cluster"]["worker"])) == 2 and report["HOROVOD_RANK"] is None
    # The CPU defaults of tfscale.train --num_processes: disjoint cores, threads sized to them.
    cores = [set(ranks[r]["cores"]) for r in (0, 1)]
    if len(os.sched_getaffinity(0)) >= 2:
        assert cores[0] and cores[1] and not cores[0] & cores[1]
        for r in (0, 1):
            assert ranks[r]["TF_NUM_INTRAOP_THREADS"] == str(len(cores[r]))
            assert f"[launcher] worker {r} of 2 ({strategy}): cores " in proc.stdout
    # Every line of a worker carries its rank.
    assert all(line.startswith(("[0] ", "[1] ", "[launcher] "))
               for line in proc.stdout.splitlines())


@pytest.mark.parametrize(("fail", "restarts", "code", "attempts"), [
    ("exit:1:3", 0, 3, 1),          # a failure stops the other worker, with its exit code
    ("kill:1", 0, 128 + 9, 1),      # killed by a signal: 128 + N, as a shell says
    ("kill:1", 1, 0, 2),            # restarted once, the second attempt succeeds
    ("exit:1:75", 1, 75, 1),        # preempted: not a failure to restart
])
def test_failing_worker(fail: str, restarts: int, code: int, attempts: int,
                        tmp_path: Path) -> None:
    proc = tfscale_run(tmp_path, "--nproc=2", "--strategy=multiworker",
                       f"--max_restarts={restarts}", "PROBE", f"--fail={fail}")
    assert proc.returncode == code, proc.stdout + proc.stderr
    how = "was killed by SIGKILL" if fail.startswith("kill") else f"exited with code {code}"
    assert f"[launcher] worker 1 {how}; stopping workers [0]" in proc.stdout
    # (attempt, rank) -> report; worker 0 may be stopped before it reports on a failed attempt.
    reports = {(int(r["TFSCALE_RESTART"]), int(r["TFSCALE_LOCAL_RANK"])): r
               for r in (json.loads(line.split(" seen ", 1)[1])
                         for line in proc.stdout.splitlines() if " seen " in line)}
    assert {attempt for attempt, _ in reports} == set(range(attempts))
    if attempts == 2:
        assert f"[launcher] worker 1 {how}; restart 1 of 1" in proc.stdout
        assert (1, 0) in reports and (1, 1) in reports
        # A fresh cluster for the new attempt: other ports.
        assert json.loads(reports[0, 1]["TF_CONFIG"])["cluster"] != \
            json.loads(reports[1, 1]["TF_CONFIG"])["cluster"]
    else:
        assert "restart 1 of" not in proc.stdout


def test_signal_is_forwarded_and_not_restarted(tmp_path: Path) -> None:
    log = tmp_path / "log"
    with open(log, "w") as out:
        launcher = subprocess.Popen(
            [sys.executable, "-m", "tfscale.run", "--nproc=2", "--strategy=multiworker",
             "--max_restarts=1", str(PROBE), "--fail=wait"],
            cwd=tmp_path, env={**os.environ, **ENV}, stdout=out, stderr=subprocess.STDOUT,
            text=True, start_new_session=True)
        try:
            wait_for(lambda: log.read_text().count("waiting") == 2, 30, "two waiting workers")
            launcher.send_signal(signal.SIGTERM)
            code = launcher.wait(timeout=30)
        finally:
            kill_group(launcher)
    text = log.read_text()
    assert code == 7, text
    assert "restart 1 of" not in text and text.count(" seen ") == 2


def test_under_a_cluster_launcher_it_sets_variables_and_starts_nothing(tmp_path: Path) -> None:
    slurm = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NODEID": "1",
             "SLURM_JOB_NODELIST": "a,b", "SLURM_TASKS_PER_NODE": "2(x2)",
             "SLURM_RESTART_COUNT": "2"}
    proc = subprocess.Popen([sys.executable, "-m", "tfscale.run", "--strategy=multiworker",
                             "--port=23456", str(PROBE), "x"], cwd=tmp_path,
                            env={**os.environ, **ENV, **slurm}, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        kill_group(proc)
    assert proc.returncode == 0, out + err
    report = json.loads(out.split("seen ", 1)[1])
    assert report["pid"] == proc.pid, "the script did not replace tfscale-run (exec)"
    assert "[launcher]" not in out and not out.startswith("[")
    # A requeued Slurm job is a restart too.
    assert report["TFSCALE_STRATEGY"] == "multiworker" and report["TFSCALE_RESTART"] == "2"
    assert report["TFSCALE_LOCAL_RANK"] is None and report["HOROVOD_RANK"] is None
    assert json.loads(report["TF_CONFIG"]) == {
        "cluster": {"worker": ["a:23456", "a:23457", "b:23456", "b:23457"]},
        "task": {"type": "worker", "index": 3}}
    assert report["args"] == ["x"]


@pytest.mark.parametrize(("argv", "message"), [
    ([], "no script given"),
    (["--nproc=0", "s.py"], "--nproc=0: expected a number of workers >= 1"),
    (["--nproc=two", "s.py"], "invalid int value: 'two'"),
    (["--strategy=nope", "s.py"], "unknown strategy 'nope'; available: "),
    (["--nproc=2", "--strategy=mirrored", "s.py"], "--strategy=mirrored runs in one process"),
    (["--max_restarts=-1", "s.py"], "--max_restarts=-1: expected a count >= 0"),
    (["missing.py"], "script missing.py not found"),
    (["-m", "no_such_module_here"], "-m no_such_module_here: no such module"),
])
def test_bad_usage_is_one_line_and_exit_2(argv: list[str], message: str, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch,
                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "s.py").write_text("")
    with pytest.raises(SystemExit) as stop:
        sys.exit(run.main(argv, environ={}))
    assert stop.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("tfscale-run: error: ") and message in err


def test_nocpu_binding_leaves_the_workers_unbound(tmp_path: Path) -> None:
    proc = tfscale_run(tmp_path, "--nproc=2", "--strategy=multiworker", "--nocpu_binding",
                       "PROBE")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for report in seen(proc.stdout).values():
        assert report["cores"] == sorted(os.sched_getaffinity(0))
        assert report["TF_NUM_INTRAOP_THREADS"] == os.environ.get("TF_NUM_INTRAOP_THREADS")


@pytest.mark.slow
def test_a_late_setup_ends_in_one_line_and_the_workers_describe_their_binding(
        tmp_path: Path) -> None:
    late = ROOT / "tests" / "workers" / "late_setup.py"
    proc = tfscale_run(tmp_path, "--nproc=2", "--strategy=multiworker", "--max_restarts=1",
                       # as if unset (conftest sets 2): TensorFlow prints its INFO lines
                       str(late), env={"TF_CPP_MIN_LOG_LEVEL": ""})
    out = proc.stdout + proc.stderr
    # tfscale.setup's own one line, bad usage's exit code, and no restart. (The first worker
    # to fail stops the other, which may not have got as far.)
    assert proc.returncode == 2, out
    assert "Traceback" not in out and "not reached" not in out and "restart 1 of" not in out
    failed = [rank for rank in (0, 1) if f"[{rank}] error: tfscale.setup: --strategy=multiworker "
              "must start before TensorFlow runs anything" in out]
    assert failed, out
    # TensorFlow's start-up notices, which TF_CPP_MIN_LOG_LEVEL cannot silence, are left out.
    assert "absl::InitializeLog" not in out and "oneDNN custom operations" not in out
    # What a worker says of its cores and threads is what the launcher gave it.
    described = [rank for rank in (0, 1) if f"[{rank}] local worker {rank} of 2: " in out]
    assert set(failed) <= set(described)
    for rank in described:
        launcher = next(line for line in out.splitlines()
                        if line.startswith(f"[launcher] worker {rank} of 2 "))
        worker = next(line for line in out.splitlines()
                      if line.startswith(f"[{rank}] local worker {rank} of 2: "))
        where, threads = launcher.split(": ", 1)[1].split("; intra-op threads ")
        if where == "not bound":
            assert "not bound (any of" in worker, (launcher, worker)
        else:
            assert f"bound to cores {where.removeprefix('cores ')} " in worker, (launcher, worker)
        assert f"intra-op threads {threads}" in worker, (launcher, worker)
