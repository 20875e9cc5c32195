"""``pip install .`` and ``pip install -e .`` into a fresh environment that has TensorFlow.

The environment is a new venv that sees this project's ``.venv`` site-packages through a
``.pth`` file (TensorFlow, Keras, Horovod), with nothing of this checkout on its path. It is
installed from a copy of the source tree (pip builds in the tree it is given, and the build
must not litter the checkout). The commands then run from a directory outside both, so they
work only if the install put the packages and console scripts in place.
"""

from __future__ import annotations

import json
import shutil
import site
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY, run_process

pytestmark = pytest.mark.slow

PACKAGES = ("tfscale", "models", "input_pipelines", "launch")


def _install(venv: Path, source: Path, *pip_args: str) -> Path:
    """A venv with ``source`` installed by ``pip install PIP_ARGS``; returns its bin/."""
    proc = run_process([sys.executable, "-m", "venv", str(venv)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    bin_dir = venv / "bin"
    purelib = run_process([str(bin_dir / "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    (Path(purelib.stdout.strip()) / "project_stack.pth").write_text(
        "\n".join(site.getsitepackages()) + "\n")
    proc = run_process([str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "--no-deps",
                        "--no-build-isolation", "--no-index", *pip_args, str(source)],
                       timeout=180, env={"PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return bin_dir


def _installed(kind: str, factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(the venv's bin/, the source copy, an unrelated working directory)."""
    source = factory.mktemp("source") / "tfscale"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".venv", ".git", "runs", "__pycache__", "*.egg-info", "build", ".*_cache"))
    bin_dir = _install(factory.mktemp(f"venv-{kind}"), source,
                       *(["-e"] if kind == "editable" else []))
    return bin_dir, source, factory.mktemp("elsewhere")


@pytest.fixture(scope="module")
def regular(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return _installed("regular", tmp_path_factory)


@pytest.fixture(scope="module")
def editable(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    return _installed("editable", tmp_path_factory)


def _run(command: list[str], cwd: Path, timeout: float = 120) -> str:
    proc = run_process(command, timeout=timeout, cwd=cwd, env={"PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("kind", ["regular", "editable"])
def test_packages_and_commands_work_from_any_directory(
        kind: str, request: pytest.FixtureRequest) -> None:
    bin_dir, source, elsewhere = request.getfixturevalue(kind)
    found = json.loads(_run([str(bin_dir / "python"), "-c",
                             "import importlib, json; print(json.dumps({p: importlib.import_module"
                             f"(p).__file__ for p in {PACKAGES!r}}}))"], elsewhere))
    for package, path in found.items():
        if kind == "regular":
            assert Path(path).is_relative_to(bin_dir.parent), (package, path)
        else:
            assert Path(path).is_relative_to(source), (package, path)
    listing = _run([str(bin_dir / "tfscale-train"), "--list"], elsewhere)
    assert "tiny_cnn" in listing and "horovod" in listing and "synthetic" in listing
    sweep = run_process([str(bin_dir / "tfscale-sweep"), "--grid=nonsense"], cwd=elsewhere,
                        env={"PYTHONPATH": ""})
    assert sweep.returncode == 2 and "error: --grid='nonsense'" in sweep.stderr
    script = _run([str(bin_dir / "tfscale-jobscript"), "slurm", "--nodes=2", "--",
                   "--model=tiny_cnn", "--strategy=horovod"], elsewhere)
    # The ranks run the installed environment's Python, in the directory it was written from.
    assert f"{bin_dir / 'python'} -m tfscale.train --model=tiny_cnn" in script
    assert f"cd {elsewhere}" in script


def test_installed_train_runs_two_local_workers_from_elsewhere(
        regular: tuple[Path, Path, Path]) -> None:
    bin_dir, _, elsewhere = regular
    model_dir = elsewhere / "run"
    out = _run([str(bin_dir / "tfscale-train"), *TINY, "--strategy=multiworker",
                "--num_processes=2", "--steps=2", f"--model_dir={model_dir}"], elsewhere,
               timeout=180)
    assert "[0] step 2/2" in out
    results = json.loads((model_dir / "results.json").read_text())
    assert results["num_workers"] == 2 and results["steps"] == 2
