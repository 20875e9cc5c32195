"""``--max_restarts``: a worker SIGKILLed mid-run restarts the whole group, which resumes from
its last checkpoint to the weights of an uninterrupted run; without restarts the job ends as
before (docs/RELIABILITY.md)."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import TINY, read_results, requires_horovod, run_train
from tests.faults import TRAIN, started, wait_for, worker_pids
from tfscale.training.checkpointing import CheckpointManager
from tfscale.training.events import read_events

pytestmark = [pytest.mark.slow, requires_horovod]
STEPS = 200
FLAGS = [*TINY, "--strategy=horovod", "--num_processes=2", f"--steps={STEPS}", "--deterministic",
         "--checkpoint_every=20", "--log_every=50"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> list[np.ndarray]:
    """The final weights of the run without a fault (one run shared by the tests)."""
    run = tmp_path_factory.mktemp("uninterrupted")
    done = run_train(*FLAGS, f"--model_dir={run}")
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return CheckpointManager(run / "checkpoints").read(STEPS)[1]


def _kill_worker_1(tmp_path: Path, max_restarts: int, when: str) -> tuple[int, str]:
    """Runs the job with ``--max_restarts``, SIGKILLs worker 1 once ``when`` ("checkpoint":
    the first checkpoint is written; "started": both workers exist), and returns the
    launcher's exit code and output."""
    run, log = tmp_path / "run", tmp_path / "log"
    manager = CheckpointManager(run / "checkpoints")
    with started([*TRAIN, *FLAGS, f"--model_dir={run}", f"--max_restarts={max_restarts}"],
                 log=log) as launcher:
        if when == "checkpoint":
            wait_for(lambda: bool(manager.steps()), 120, "a first checkpoint")
        wait_for(lambda: len(worker_pids(str(tmp_path))) == 2, 60, "two workers")
        os.kill(worker_pids(str(tmp_path))[1], signal.SIGKILL)
        code = launcher.wait(timeout=180)
    return code, log.read_text()


def test_killed_worker_restarts_to_the_uninterrupted_weights(
        tmp_path: Path, uninterrupted: list[np.ndarray]) -> None:
    code, text = _kill_worker_1(tmp_path, max_restarts=1, when="checkpoint")
    assert code == 0, text[-3000:]
    assert "[launcher] worker 1 was killed by SIGKILL; restart 1 of 1" in text
    run = tmp_path / "run"
    starts = [e for e in read_events(run / "events.jsonl") if e["event"] == "run_start"]
    assert [e["restart"] for e in starts] == [0, 1]
    assert 0 < starts[1]["first_step"] < STEPS, "the restarted group did not resume"
    results = read_results(run)
    assert results["restarts"] == 1 and results["steps"] == STEPS
    weights = CheckpointManager(run / "checkpoints").read(STEPS)[1]
    assert max(float(np.max(np.abs(a - b)))
               for a, b in zip(weights, uninterrupted, strict=True)) < 1e-6


def test_without_restarts_a_killed_worker_ends_the_job(tmp_path: Path) -> None:
    # What the launcher does with a killed worker does not depend on the step it died at
    # (test_reliability kills one mid-run); killing it at start-up keeps this test short.
    code, text = _kill_worker_1(tmp_path, max_restarts=0, when="started")
    assert code == 128 + signal.SIGKILL, text[-3000:]
    assert "worker 1 was killed by SIGKILL; stopping workers [0]" in text
    assert "restart 1 of" not in text
    wait_for(lambda: not worker_pids(str(tmp_path)), 30, "no worker left behind")
