"""Horovod strategy with real processes under ``horovodrun --gloo -np 2``."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest

from tests.conftest import (
    TINY,
    assert_exchange_share_logged,
    horovodrun,
    read_results,
    requires_horovod,
    run_process,
    run_train,
)
from tests.equivalence import (
    WORKER,
    assert_replicas_equal,
    load_weights,
    max_abs_diff,
    reference,
)

pytestmark = [pytest.mark.slow, requires_horovod]


def _horovod_workers(out: Path, steps: int, batch: int, *flags: str) -> None:
    proc = run_process([horovodrun(), "--gloo", "-np", "2", "-H", "localhost:2", *WORKER,
                        "--strategy=horovod", f"--batch={batch}", f"--steps={steps}",
                        f"--out={out}", *flags], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.mark.parametrize(("exchange", "transport"), [("shared_memory", "shared memory"),
                                                     ("collectives", "Horovod (Gloo)")])
def test_one_step_equals_single_process_on_combined_batch(exchange: str, transport: str,
                                                          tmp_path: Path) -> None:
    _horovod_workers(tmp_path / "hvd", 1, 4, f"--node_exchange={exchange}")
    distributed = assert_replicas_equal(tmp_path / "hvd", 2)
    counts = json.loads((tmp_path / "hvd" / "rank0.json").read_text())
    assert counts["describe"].endswith(f"gradients inside a node: {transport}")
    assert counts["allreduces"] == 1
    # The exchange sums: the mean comes from each worker's loss divided by 2 (over Horovod,
    # no Average scaling the sum in its background thread).
    if exchange == "shared_memory":
        assert counts["exchange_divisors"] == [1]
    else:
        assert counts["horovod_ops"] == ["Sum"]
    single = reference(tmp_path / "ref", batch=8)
    assert max_abs_diff(distributed, single) < 1e-5
    # The logged loss is the workers' mean: the loss of the combined batch.
    logged = [json.loads((tmp_path / run / "rank0.json").read_text())["loss"]
              for run in ("hvd", "ref")]
    assert logged[0] == pytest.approx(logged[1], abs=1e-5)


def test_micro_batches_of_divided_losses_sum_to_one_process_on_all_of_them(
        tmp_path: Path) -> None:
    # The accumulating step divides each micro-batch's loss by the workers (scale_loss), and
    # the exchange sums once per step: 2 workers x 2 micro-batches x 4 equal one process x 16.
    _horovod_workers(tmp_path / "hvd", 2, 4, "--grad_accum_steps=2",
                     "--node_exchange=shared_memory")
    distributed = assert_replicas_equal(tmp_path / "hvd", 2)
    counts = json.loads((tmp_path / "hvd" / "rank0.json").read_text())
    assert counts["exchange_divisors"] == [1]
    assert max_abs_diff(distributed, reference(tmp_path / "ref", batch=16, steps=2)) < 1e-5


def test_workers_stay_identical_over_several_steps(tmp_path: Path) -> None:
    # With momentum, each worker updates its half of the weights and of the momentum
    # (tfscale.exchange.sharded_update); the weights, and the momentum once gathered as a
    # checkpoint gathers it, are one process's on the combined batch.
    _horovod_workers(tmp_path / "hvd", 5, 3, "--momentum=0.9")
    counts = json.loads((tmp_path / "hvd" / "rank0.json").read_text())
    # Every step's exchange sharded, and one more exchange: the momentum's gather.
    assert counts["sharded"] == counts["allreduces"] - 1 == 5, counts
    assert counts["describe"].endswith("SGD's momentum update sharded over 2 processes")
    distributed = assert_replicas_equal(tmp_path / "hvd", 2)
    momentum = assert_replicas_equal(tmp_path / "hvd", 2, "_momentum")
    single = reference(tmp_path / "ref", batch=6, steps=5, momentum=0.9)
    assert max_abs_diff(distributed, single) < 1e-4
    assert max_abs_diff(momentum, load_weights(tmp_path / "ref" / "rank0_momentum.npz")) < 1e-4


def test_train_cli_under_horovodrun(tmp_path: Path) -> None:
    proc = run_process([horovodrun(), "--gloo", "-np", "2", "-H", "localhost:2",
                        *_python_train(), *TINY, "--strategy=horovod", "--steps=3",
                        f"--model_dir={tmp_path}"], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = read_results(tmp_path)
    assert results["num_workers"] == 2 and results["global_batch_size"] == 8


def test_num_processes_launcher_linear_scaling_and_accumulation(tmp_path: Path) -> None:
    # With 2 micro-batches per step, steps and checkpoints count optimizer steps and the
    # global batch (and so images/s) counts both workers' micro-batches.
    proc = run_train(*TINY, "--strategy=horovod", "--num_processes=2", "--steps=4",
                     "--grad_accum_steps=2", "--lr_scaling=linear", "--learning_rate=0.05",
                     "--tensorboard=true", f"--model_dir={tmp_path}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "[0] step 4/4" in proc.stdout and "[0] step 5" not in proc.stdout
    assert "global batch 16 (4 per replica x 2 micro-batches per step)" in proc.stdout
    assert "[1] step" not in proc.stdout, "only the chief prints progress"
    # The last line's loss is the summary's: the mean over the workers of their last window.
    last = re.findall(r"\[0\] step 4/4  loss (\S+)", proc.stdout)
    final = re.findall(r"final loss \(last progress line: up to 1 steps, mean of 2 workers\) +"
                       r"(\S+)", proc.stdout)
    assert last and last == final, proc.stdout[-3000:]
    results = read_results(tmp_path)
    assert results["num_workers"] == 2 and results["steps"] == 4
    assert results["global_batch_size"] == 16 and results["grad_accum_steps"] == 2
    assert results["images_per_sec"] == pytest.approx(16 * 1000 / results["step_time_ms"])
    assert results["images_per_sec_per_worker"] == pytest.approx(results["images_per_sec"] / 2)
    assert (tmp_path / "checkpoints" / "ckpt-000000004.npz").exists()
    # The shared-memory exchange's share of each step after the compiled first.
    assert_exchange_share_logged(proc.stdout, tmp_path, [2, 3, 4])


def _python_train() -> list[str]:
    return [sys.executable, "-m", "tfscale.train"]


def test_build_probes_answer_as_horovod_does_without_importing_tensorflow() -> None:
    """The job scripts' pre-flight check (``horovod_runtime.built``) and horovodrun's own
    "built with" probes (patched by launch/build_horovod.sh) give horovod.tensorflow's answers
    without loading TensorFlow, which costs each 3-4 s of CPU."""
    import horovod.tensorflow as hvd

    probe = run_process([sys.executable, "-c", (
        "import sys\n"
        "from horovod.common import util\n"
        "from tfscale.exchange.horovod_runtime import built\n"
        "print(built('gloo'), built('mpi'), util.gloo_built(), util.mpi_built())\n"
        # The probe runs in a process forked from this one: does it hold TensorFlow?
        "print(util._check_extension_lambda('tensorflow', lambda ext: 'tensorflow' in "
        "sys.modules, 'built with Gloo', False), 'tensorflow' in sys.modules)\n")], timeout=60)
    assert probe.returncode == 0, probe.stderr[-2000:]
    answers, loaded = probe.stdout.splitlines()[-2:]
    assert answers.split() == [str(hvd.gloo_built()), str(hvd.mpi_built())] * 2
    assert loaded.split() == ["False", "False"]
    # A TensorFlow whose libraries are not where ctypes looks: horovod.tensorflow, imported.
    other = run_process([sys.executable, "-c", (
        "import glob, sys\n"
        "glob.glob = lambda pattern: []\n"
        "from tfscale.exchange.horovod_runtime import built\n"
        "print(built('gloo'), built('mpi'), 'tensorflow' in sys.modules)\n")], timeout=120)
    assert other.returncode == 0, other.stderr[-2000:]
    assert other.stdout.split()[-3:] == [str(hvd.gloo_built()), str(hvd.mpi_built()), "True"]
