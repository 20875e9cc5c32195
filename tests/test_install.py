"""``pip install .`` and ``make setup``'s editable install, each into a fresh environment.

Each environment is a new venv without pip of its own that sees this project's ``.venv``
site-packages through a ``.pth`` file (TensorFlow, Keras, Horovod, and the pip and setuptools
that install tfscale), with nothing of this checkout on its path. It is installed from a copy
of the source tree (pip builds in the tree it is given, and the build must not litter the
checkout). The commands then run from a user's project folder outside both, which has its own
``models``, ``launch`` and ``input_pipelines`` packages: they work only if the install put the
packages and commands in place and tfscale's own top-level packages win in its commands.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import site
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY, run_process

pytestmark = pytest.mark.slow

PACKAGES = ("tfscale", "models", "input_pipelines", "launch")
# A user's script in their own project: their models package beside tfscale's public API.
USER_SCRIPT = """\
import json, sys
import models
import tfscale.horovod
from tfscale.callbacks import LearningRateWarmup, MetricAverage
print(json.dumps({"models": models.__file__, "mine": models.MINE, "tfscale": tfscale.__file__,
                  "imported": [name for name in ("input_pipelines", "launch")
                               if name in sys.modules]}))
"""


def _venv(venv: Path) -> Path:
    """A fresh venv that sees the project's stack; returns its bin/."""
    proc = run_process([sys.executable, "-m", "venv", "--without-pip", str(venv)], timeout=120)
    assert proc.returncode == 0, proc.stderr
    bin_dir = venv / "bin"
    purelib = run_process([str(bin_dir / "python"), "-c",
                           "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    (Path(purelib.stdout.strip()) / "project_stack.pth").write_text(
        "\n".join(site.getsitepackages()) + "\n")
    return bin_dir


def _source(factory: pytest.TempPathFactory) -> Path:
    source = factory.mktemp("source") / "tfscale"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(
        ".venv", ".git", "runs", "__pycache__", "*.egg-info", "build", ".*_cache"))
    return source


def _user_project(factory: pytest.TempPathFactory) -> Path:
    """A user's folder with packages named like tfscale's, and their script."""
    project = factory.mktemp("user-project")
    for package in PACKAGES[1:]:
        (project / package).mkdir()
        (project / package / "__init__.py").write_text(f"MINE = {package!r}\n")
    (project / "mine.py").write_text(USER_SCRIPT)
    (project / "hello.py").write_text("import models\nprint('hello', models.MINE)\n")
    return project


# Offline: the stack comes from the project's .venv.
PIP_ENV = {"PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INDEX": "1", "PYTHONPATH": ""}


@pytest.fixture(scope="module")
def regular(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(bin/ of a venv with ``pip install SOURCE``, SOURCE, the user's project)."""
    source = _source(tmp_path_factory)
    bin_dir = _venv(tmp_path_factory.mktemp("venv-regular"))
    proc = run_process([str(bin_dir / "python"), "-m", "pip", "install", "--quiet", "--no-deps",
                        "--no-build-isolation", str(source)], timeout=180, env=PIP_ENV)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return bin_dir, source, _user_project(tmp_path_factory)


@pytest.fixture(scope="module")
def editable(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(bin/ of SOURCE/.venv after ``make setup``'s launch/setup.sh, SOURCE, the user's
    project). The venv has the requirements already (through the .pth), so setup.sh's stamp
    is written for them; setup.sh then finds Horovod (without MPI: Gloo is enough here) and
    installs tfscale editable."""
    if not Path(sys.executable).with_name("horovodrun").exists():
        pytest.skip("setup.sh would build Horovod: run launch/setup.sh for the project first")
    source = _source(tmp_path_factory)
    bin_dir = _venv(source / ".venv")
    requirements = b"".join((source / name).read_bytes()
                            for name in ("requirements.txt", "requirements-dev.txt",
                                         "requirements-data.txt"))
    (source / ".venv" / ".requirements.sha").write_text(
        hashlib.sha256(requirements).hexdigest() + "\n")
    proc = run_process(["bash", str(source / "launch" / "setup.sh")], timeout=300,
                       env={**PIP_ENV, "TFSCALE_WITH_MPI": "0"})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "installing tfscale into .venv" in proc.stdout, proc.stdout
    return bin_dir, source, _user_project(tmp_path_factory)


def _run(command: list[str], cwd: Path, timeout: float = 120,
         env: dict[str, str] | None = None) -> str:
    proc = run_process(command, timeout=timeout, cwd=cwd, env={"PYTHONPATH": "", **(env or {})})
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


@pytest.mark.parametrize("kind", ["regular", "editable"])
def test_packages_and_commands_work_from_a_project_with_its_own_packages(
        kind: str, request: pytest.FixtureRequest) -> None:
    bin_dir, source, project = request.getfixturevalue(kind)
    # -I: only what the install put on the path, not the project folder.
    found = json.loads(_run([str(bin_dir / "python"), "-I", "-c",
                             "import importlib, json; print(json.dumps({p: importlib.import_module"
                             f"(p).__file__ for p in {PACKAGES!r}}}))"], project))
    for package, path in found.items():
        if kind == "regular":
            assert Path(path).is_relative_to(bin_dir.parent), (package, path)
        else:
            assert Path(path).is_relative_to(source), (package, path)
    # The installed command, and python -m, which puts the project folder first on sys.path.
    for train in ([str(bin_dir / "tfscale-train")],
                  [str(bin_dir / "python"), "-m", "tfscale.train"]):
        listing = _run([*train, "--list"], project)
        assert "tiny_cnn" in listing and "horovod" in listing and "synthetic" in listing
    sweep = run_process([str(bin_dir / "tfscale-sweep"), "--grid=nonsense"], cwd=project,
                        env={"PYTHONPATH": ""})
    assert sweep.returncode == 2 and "error: --grid='nonsense'" in sweep.stderr
    script = _run([str(bin_dir / "tfscale-jobscript"), "slurm", "--nodes=2", "--",
                   "--model=tiny_cnn", "--strategy=horovod"], project)
    # The ranks run the installed environment's Python, in the directory it was written from.
    assert f"{bin_dir / 'python'} -m tfscale.train --model=tiny_cnn" in script
    assert f"cd {project}" in script
    assert "# Written by: tfscale-jobscript slurm --nodes=2" in script
    # tfscale.run's parent imports tfscale's tfscale.scripts.launcher; its worker, the user's
    # script, the
    # user's models.
    hello = _run([str(bin_dir / "python"), "-m", "tfscale.run", "--nproc=1", "hello.py"],
                 project)
    assert "[0] hello models" in hello, hello


def test_installed_commands_help_as_python_m_does(regular: tuple[Path, Path, Path]) -> None:
    bin_dir, _, project = regular
    # command: (its module, a line of its description, one of its options)
    commands = {"tfscale-train": ("tfscale.train", "Train a registered model", "--model:"),
                "tfscale-sweep": ("tfscale.sweep", "Sweep ``tfscale.train`` flags", "--grid:"),
                "tfscale-forecast": ("tfscale.forecast", "time to accuracy", "--machine:"),
                "tfscale-predict": ("tfscale.predict", "Predict with the model", "--top_k:"),
                "tfscale-jobscript": ("launch.jobscript", "Write a ready job script", "LAUNCHER")}
    for name, (module, description, option) in commands.items():
        installed = _run([str(bin_dir / name), "--help"], project)
        # From the venv: python -m launch.jobscript cannot start where launch is the user's.
        python_m = _run([str(bin_dir / "python"), "-m", module, "--help"], bin_dir)
        # absl heads the key flags with the program's path: the module's file under python -m.
        python_m = re.sub(r"(?m)^/\S+:$", f"{bin_dir / name}:", python_m)
        assert installed == python_m.replace(f"python -m {module}", name), name
        assert description in installed and option in installed, installed
        # Not absl's fallback for a __main__ without a docstring (USAGE: ... Try --helpfull).
        assert f"{name} " in installed and "USAGE:" not in installed, installed
    # Horovod's build script ships with the package, behind its own command.
    assert "tfscale-build-horovod [PYTHON]" in _run([str(bin_dir / "tfscale-build-horovod"),
                                                    "--help"], project)
    bad = run_process([str(bin_dir / "tfscale-build-horovod"), "/nonexistent/python"],
                      cwd=project, env={"PYTHONPATH": "", "TFSCALE_WITH_MPI": "0"})
    assert bad.returncode == 2, bad.stdout + bad.stderr
    assert "PYTHON=/nonexistent/python is not an interpreter" in bad.stderr


def test_setup_makes_the_activated_venv_import_tfscale_beside_a_users_models(
        editable: tuple[Path, Path, Path]) -> None:
    bin_dir, source, project = editable
    activated = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
                 "VIRTUAL_ENV": str(bin_dir.parent)}
    seen = json.loads(_run(["python", "mine.py"], project, timeout=180, env=activated))
    assert seen["mine"] == "models" and Path(seen["models"]).is_relative_to(project), seen
    assert Path(seen["tfscale"]).is_relative_to(source), seen
    assert seen["imported"] == [], "tfscale's library imported its top-level packages"


def test_installed_train_runs_two_local_workers_from_a_project_with_its_own_packages(
        regular: tuple[Path, Path, Path]) -> None:
    bin_dir, _, project = regular
    model_dir = project / "run"
    out = _run([str(bin_dir / "tfscale-train"), *TINY, "--strategy=multiworker",
                "--num_processes=2", "--steps=2", f"--model_dir={model_dir}"], project,
               timeout=180)
    assert "[0] step 2/2" in out
    results = json.loads((model_dir / "results.json").read_text())
    assert results["num_workers"] == 2 and results["steps"] == 2
