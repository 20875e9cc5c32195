"""Per-local-rank CPU binding."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from tests.conftest import run_process
from tfscale.cluster.cpu_binding import Threads, cores_for, local_layout


def test_layout_from_launcher_variables() -> None:
    horovodrun = {"HOROVOD_RANK": "5", "HOROVOD_SIZE": "8", "HOROVOD_LOCAL_RANK": "1",
                  "HOROVOD_LOCAL_SIZE": "4"}
    assert local_layout(horovodrun) == (1, 4)
    assert local_layout({"TFSCALE_LOCAL_RANK": "0", "TFSCALE_LOCAL_SIZE": "2"}) == (0, 2)
    assert local_layout({}) == (0, 1)


def test_cores_are_split_into_disjoint_blocks() -> None:
    cores = list(range(8))
    blocks = [cores_for(r, 3, cores) for r in range(3)]
    assert blocks == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(ValueError, match="3 workers on this node but only 2 cores"):
        cores_for(0, 3, [0, 1])


INHERITED = """
import os
from tfscale.cluster.cpu_binding import Threads
threads = Threads(1, 2, None, 0, 0)
print(threads.describe({}))
os.sched_setaffinity(0, [max(os.sched_getaffinity(0))])
print(threads.describe({"TF_NUM_INTRAOP_THREADS": "1"}))
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2 or len(os.sched_getaffinity(0)) <
                    (os.cpu_count() or 0), reason="needs 2 cores, all of this machine's")
def test_a_worker_describes_the_binding_and_threads_it_was_started_with() -> None:
    # tfscale-run binds its workers and sets TF_NUM_INTRAOP_THREADS before they start.
    proc = run_process([sys.executable, "-c", INHERITED], timeout=60)
    assert proc.returncode == 0, proc.stderr
    last = max(os.sched_getaffinity(0))
    assert proc.stdout.splitlines() == [
        f"local worker 1 of 2: not bound (any of {len(os.sched_getaffinity(0))} cores); "
        "intra-op threads TF default, inter-op threads TF default",
        f"local worker 1 of 2: bound to cores {last} when it started (by its launcher); "
        "intra-op threads 1 (TF_NUM_INTRAOP_THREADS), inter-op threads TF default"]
    assert Threads(0, 1, [0], 2, 3).describe({"TF_NUM_INTRAOP_THREADS": "1"}).endswith(
        "(--cpu_binding); intra-op threads 2, inter-op threads 3")


PROBE = """
import os, sys
from tfscale.training.trainer import configure_runtime
from tfscale.config.train_config import TrainConfig
configure_runtime(TrainConfig(model="tiny_cnn", cpu_binding=True,
                              intra_op_threads=int(os.environ["INTRA"])))
import tensorflow as tf
print(sorted(os.sched_getaffinity(0)), tf.config.threading.get_intra_op_parallelism_threads())
"""


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs 2 cores")
def test_each_local_worker_gets_its_own_core(tmp_path: Path) -> None:
    seen, logged = [], []
    # Worker 1 sets its thread count: that must not undo its binding.
    for rank, intra in ((0, 0), (1, 1)):
        proc = run_process([sys.executable, "-c", PROBE], timeout=120,
                           env={"TFSCALE_LOCAL_RANK": str(rank), "TFSCALE_LOCAL_SIZE": "2",
                                "INTRA": str(intra)})
        assert proc.returncode == 0, proc.stderr[-2000:]
        seen.append(proc.stdout.strip().splitlines()[-1])
        logged.append(next(line for line in proc.stderr.splitlines()
                           if line.startswith(f"local worker {rank} of 2: ")))
    available = sorted(os.sched_getaffinity(0))
    half = len(available) // 2
    first, second = available[:half], available[half:2 * half]
    assert seen == [f"{first} {half}", f"{second} 1"]
    assert logged == [
        f"local worker 0 of 2: bound to cores {','.join(map(str, first))} (--cpu_binding); "
        f"intra-op threads {half}, inter-op threads TF default",
        f"local worker 1 of 2: bound to cores {','.join(map(str, second))} (--cpu_binding); "
        "intra-op threads 1, inter-op threads TF default"]
