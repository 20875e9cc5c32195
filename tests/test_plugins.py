"""Plugins of one file each, as docs/EXTENDING.md writes them: a dataset format and a model in
one module of an installed package (``acme/arrays.py``), which tfscale lists, recognizes,
trains, evaluates and times like a built-in; and a job-script generator
(``launch/jobs/pbs.py``) that ``launch.jobscript`` offers and checks like a built-in one."""

from __future__ import annotations

import importlib
import json
import os
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, read_results, run_process, run_train
from tests.test_registry import _doc_example, install

TRAIN, VALIDATION = 24, 10  # examples in train.npz and validation.npz
SIZE = 8
SMALL = ["--image_size=8", "--input_channels=1", "--num_classes=2", "--batch_size=4"]


def write_arrays(data_dir: Path) -> None:
    """``train.npz`` and ``validation.npz`` in acme/arrays.py's format: 8x8 gray images,
    label 0 bright in the top half, label 1 in the bottom half."""
    data_dir.mkdir()
    rng = np.random.default_rng(0)
    for split, count in (("train", TRAIN), ("validation", VALIDATION)):
        labels = np.arange(count) % 2
        images = rng.integers(0, 64, (count, SIZE, SIZE, 1), dtype=np.uint8)
        images[labels == 0, :SIZE // 2] += 128
        images[labels == 1, SIZE // 2:] += 128
        np.savez(data_dir / f"{split}.npz", images=images, labels=labels)


@pytest.fixture
def acme_arrays(tmp_path: Path) -> dict[str, str]:
    """docs/EXTENDING.md's acme/arrays.py installed as a package whose two entry points name
    it, one as a model and one as a dataset; returns the environment that sees it."""
    site = tmp_path / "site"
    install(site, "acme", {"__init__.py": "", "arrays.py": _doc_example("acme/arrays.py")},
            "[tfscale.models]\nacme_linear = acme.arrays\n\n"
            "[tfscale.datasets]\nacme_arrays = acme.arrays\n")
    return {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}


def test_a_format_and_a_model_from_one_module_are_listed(acme_arrays: dict[str, str]) -> None:
    proc = run_process([sys.executable, "-m", "tfscale.train", "--list"], timeout=120,
                       env=acme_arrays)
    assert proc.returncode == 0, proc.stderr
    models_part, rest = proc.stdout.split("\ndatasets:\n")
    datasets_part = rest.split("\nstrategies:\n")[0]
    assert re.search(r"^  acme_linear +one dense layer on the pixels$", models_part, re.M)
    assert re.search(r"^  acme_arrays +images and labels in train.npz and validation.npz$",
                     datasets_part, re.M)
    assert "plugin" not in proc.stderr, proc.stderr  # no entry point failed to load


@pytest.mark.slow
def test_a_format_is_recognized_trained_and_evaluated_on_its_validation_file(
        tmp_path: Path, acme_arrays: dict[str, str]) -> None:
    data = tmp_path / "digits"
    write_arrays(data)
    model_dir = tmp_path / "run"
    # No --dataset: the format's recognizer claims the directory; its has_validation rule
    # turns evaluation on.
    proc = run_train("--model=acme_linear", f"--data_dir={data}", *SMALL, "--steps=3",
                     "--learning_rate=0.1", "--tensorboard=false", f"--model_dir={model_dir}",
                     timeout=240, env=acme_arrays)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (f"--dataset not given: --data_dir={data} holds train.npz of images and labels; "
            "using --dataset=acme_arrays") in proc.stderr
    results = read_results(model_dir)
    assert (results["model"], results["dataset"]) == ("acme_linear", "acme_arrays")
    assert results["evaluations"], "the run did not evaluate on validation.npz"
    evaluation = results["evaluations"][-1]
    assert evaluation["examples"] == VALIDATION  # the whole validation file, once
    assert np.isfinite(evaluation["metrics"]["val_loss"])


def test_io_check_times_the_files_the_format_declares(tmp_path: Path,
                                                      acme_arrays: dict[str, str]) -> None:
    data = tmp_path / "digits"
    write_arrays(data)
    out = tmp_path / "io.json"
    proc = run_process([sys.executable, "-m", "input_pipelines.tools.io_check",
                        "--model=acme_linear", f"--data_dir={data}", *SMALL, "--seconds=0.05",
                        "--model_images_per_sec=1000", f"--json={out}"],
                       timeout=240, env=acme_arrays)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["dataset"] == "acme_arrays"
    # train.npz alone: the format's files= rule, not every file of the directory.
    assert result["storage"]["files"] == 1
    assert result["storage"]["bytes"] == (data / "train.npz").stat().st_size
    assert result["pipeline"]["images"] == TRAIN
    assert f"{TRAIN} training images in 1 file(s)" in proc.stdout


def test_the_tools_ask_the_registry_instead_of_naming_datasets() -> None:
    compared = re.compile(r"dataset\s*(==|!=|in)\s*[\"'(\[{]")
    found = [f"{path.relative_to(ROOT)}:{number}"
             for path in sorted((ROOT / "input_pipelines").rglob("*.py"))
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if compared.search(line)]
    assert found == []


@pytest.fixture
def pbs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """docs/EXTENDING.md's launch/jobs/pbs.py, imported (which registers it) and removed after."""
    from launch.jobs.registry import GENERATORS

    (tmp_path / "pbs_jobs.py").write_text(_doc_example("launch/jobs/pbs.py"))
    monkeypatch.syspath_prepend(str(tmp_path))
    importlib.import_module("pbs_jobs")
    try:
        yield
    finally:
        GENERATORS._entries.pop("pbs")
        sys.modules.pop("pbs_jobs")


def test_a_job_script_generator_is_one_module(pbs: None, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from launch.jobscript import build_parser, main

    assert "qsub script, mpiexec -ppn" in build_parser().format_help()
    job = tmp_path / "job.pbs"
    assert main(["pbs", "--nodes=2", "--gpus_per_node=4", "--time=90", "--account=abc",
                 "-o", str(job), "--", "--strategy=horovod", "--model=mlp"]) == 0
    text = job.read_text()
    for line in ("#PBS -l select=2:mpiprocs=4:ngpus=4", "#PBS -l walltime=01:30:00",
                 "#PBS -A abc", "rank=${PMI_RANK:?not started by mpiexec}",
                 "mpiexec \\\n    -n 8 \\\n    -ppn 4", "if not built('mpi'):"):
        assert line in text, line
    capsys.readouterr()
    assert main(["pbs", "--nodes=2", "--gpus_per_node=4", "--", "--strategy=multiworker",
                 "--model=mlp"]) == 2
    assert ("error: pbs cannot start --strategy=multiworker jobs; it starts ddl, horovod jobs, "
            "and multiworker runs under lsf, mpirun, slurm") in capsys.readouterr().err
