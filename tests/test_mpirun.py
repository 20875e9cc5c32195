"""Real Open MPI runs: tfscale.train as an ``mpirun`` job on an MPI-built Horovod (marker ``mpi``).

Skipped, with the reason, where mpirun or an MPI-built Horovod is missing; set them up with
``TFSCALE_WITH_MPI=1 bash launch/setup.sh`` (see BUILD.md).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from launch.jobscript import main as jobscript
from tests.conftest import ROOT, read_results, run_process

pytestmark = [pytest.mark.mpi, pytest.mark.slow]
TRAIN = ["-m", "tfscale.train", "--strategy=horovod", "--model=tiny_cnn", "--image_size=32",
         "--num_classes=4", "--batch_size=4", "--steps=3", "--tensorboard=false"]


@pytest.fixture(scope="module")
def mpi_env() -> dict[str, str]:
    """The environment for mpirun here; skips when MPI or an MPI-built Horovod is missing."""
    if shutil.which("mpirun") is None:
        pytest.skip("Open MPI's mpirun is not installed (TFSCALE_WITH_MPI=1 bash launch/setup.sh)")
    check = subprocess.run([sys.executable, "-c", "from tfscale.exchange.horovod_runtime "
                            "import built; print(built('mpi'), built('gloo'))"],
                           capture_output=True, text=True, cwd=ROOT)
    if check.stdout.split() != ["True", "True"]:
        pytest.skip("Horovod here is not built with MPI and Gloo "
                    f"({check.stdout.strip() or check.stderr.strip()[-200:]}); "
                    "run TFSCALE_WITH_MPI=1 bash launch/setup.sh")
    env: dict[str, str] = {}
    if os.geteuid() == 0:  # containers: Open MPI refuses root unless told
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    return env


def test_mpirun_np2_trains_two_horovod_ranks(tmp_path: Path, mpi_env: dict[str, str]) -> None:
    proc = run_process(["mpirun", "-np", "2", sys.executable, *TRAIN,
                        f"--model_dir={tmp_path}"], timeout=300, env=mpi_env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "horovod: 2 process(es)" in proc.stdout
    results = read_results(tmp_path)
    assert results["strategy"] == "horovod" and results["num_workers"] == 2
    assert results["steps"] == 3 and results["global_batch_size"] == 8


def test_generated_mpirun_script_binds_each_rank(tmp_path: Path, mpi_env: dict[str, str]) -> None:
    job, model_dir = tmp_path / "job.sh", tmp_path / "model"
    assert jobscript(["mpirun", "-H", "localhost:2", "--cores_per_rank", "1",
                      "--log_dir", str(tmp_path), "-o", str(job), "--", *TRAIN[2:],
                      f"--model_dir={model_dir}"]) == 0
    proc = run_process(["bash", str(job)], timeout=300, env={**mpi_env, "SLURM_JOB_ID": "mpi"})
    logs = sorted((tmp_path / "tfscale-mpi").glob("rank-*.log"))
    assert proc.returncode == 0, proc.stderr[-3000:] + "".join(p.read_text()[-2000:]
                                                                for p in logs)
    # --report-bindings: each rank is bound to its own core.
    assert "MCW rank 0 bound to" in proc.stderr and "MCW rank 1 bound to" in proc.stderr
    assert [p.name for p in logs] == ["rank-0.log", "rank-1.log"]
    results = read_results(model_dir)
    assert results["strategy"] == "horovod" and results["num_workers"] == 2
