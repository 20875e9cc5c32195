"""Registries: registration, lookup, errors that list names, strategy plugins."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import input_pipelines
import models
from tests.conftest import ROOT, read_results, run_process
from tfscale.config.registry import Registry, UnknownNameError


def install(site: Path, package: str, files: dict[str, str], entry_points: str) -> None:
    """Installs package ``package`` (its ``files`` by name) in ``site`` the way pip would for
    entry points: the package and a ``.dist-info`` with METADATA and entry_points.txt."""
    (site / package).mkdir(parents=True)
    for name, text in files.items():
        (site / package / name).write_text(text)
    dist = site / f"{package}-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {package}\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(entry_points)


def test_registry_lookup_and_listing() -> None:
    reg: Registry[int] = Registry("widget")
    reg.add("b", 2, "the second")
    reg.register("a", "the first", color="red")(1)
    assert reg.get("a") == 1 and reg.entry("a").meta == {"color": "red"}
    assert reg.names() == ["a", "b"]
    assert "a  the first" in reg.describe()
    with pytest.raises(UnknownNameError, match="unknown widget 'c'; available: a, b"):
        reg.get("c")
    with pytest.raises(ValueError, match="already registered"):
        reg.add("a", 3, "clash")


def test_builtin_plugins_are_registered() -> None:
    assert {"resnet50", "tiny_cnn"} <= set(models.MODELS.names())
    assert models.task_of("resnet50") == "classification"
    assert "synthetic" in input_pipelines.PIPELINES.names()
    from tfscale.strategies import STRATEGIES

    assert {"default", "horovod"} <= set(STRATEGIES.names())


def test_third_party_strategy_registers() -> None:
    from tfscale.config.train_config import TrainConfig
    from tfscale.strategies import STRATEGIES, SingleProcessStrategy, create, register

    class Mine(SingleProcessStrategy):
        """A user's strategy."""

    register("mine_for_test", Mine, "a user's strategy")
    try:
        assert isinstance(create(TrainConfig(strategy="mine_for_test")), Mine)
        with pytest.raises(TypeError, match="not a tfscale Strategy subclass"):
            register("bad_for_test", int, "not a strategy")  # type: ignore[arg-type]
    finally:
        STRATEGIES._entries.pop("mine_for_test")


def test_strategy_from_an_installed_package_entry_point(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tfscale.strategies import STRATEGIES, registry

    install(tmp_path, "acme_strategy", {"__init__.py": (
        "from tfscale.strategies import SingleProcessStrategy\n\n"
        "class AcmeStrategy(SingleProcessStrategy):\n"
        '    """Acme\'s in-house strategy."""\n')},
        "[tfscale.strategies]\nacme = acme_strategy:AcmeStrategy\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        registry.load_plugins()
        assert STRATEGIES.entry("acme").description == "Acme's in-house strategy."
        assert STRATEGIES.get("acme").__name__ == "AcmeStrategy"
    finally:
        STRATEGIES._entries.pop("acme", None)


ACME = '''"""Acme's strategies: a Horovod one and a TF_CONFIG one, named by entry points only."""
from tfscale.config.options import Option
from tfscale.strategies.horovod import HorovodStrategy
from tfscale.strategies.multiworker import MultiWorkerStrategy

SPREAD = Option("acme_spread", 1, "Acme: racks the workers spread over.", minimum=1)


class AcmeHorovod(HorovodStrategy):
    """Acme's Horovod strategy."""


class AcmeWorkers(MultiWorkerStrategy):
    """Acme's multi-worker strategy."""

    options = (*MultiWorkerStrategy.options, SPREAD)

    @classmethod
    def environment(cls, config):
        return {**super().environment(config), "ACME_SPREAD": str(SPREAD.of(config))}
'''

# In a worker's process: the flags of a job's command line, back into the strategy.
WORKER = """
import json, sys
from absl import flags
from tfscale.cli.flags import config_from_flags, define_flags
from tfscale.strategies import create
from acme_strategies import SPREAD
values = flags.FlagValues()
define_flags(values)
values(["train", *sys.argv[1:]])
config = config_from_flags(values)
strategy = create(config)
print(json.dumps({"spread": SPREAD.of(strategy.config), "class": type(strategy).__name__,
                  "argv": config.to_argv(), "help": values.get_help()}))
"""


@pytest.fixture
def acme(tmp_path: Path) -> dict[str, str]:
    """An installed package (on PYTHONPATH, for subprocesses) declaring two strategies as
    entry points; returns the environment that sees it."""
    site = tmp_path / "site"
    install(site, "acme_strategies", {"__init__.py": ACME},
            "[tfscale.strategies]\nacme_hvd = acme_strategies:AcmeHorovod\n"
            "acme_workers = acme_strategies:AcmeWorkers\n")
    return {"PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}


def test_plugin_strategy_gets_job_scripts_from_its_class(tmp_path: Path,
                                                         acme: dict[str, str]) -> None:
    def jobscript(*args: str) -> subprocess.CompletedProcess[str]:
        return run_process([sys.executable, "-m", "launch.jobscript", *args], timeout=120,
                           env=acme)

    job = tmp_path / "job"
    workers = ("--", "--strategy=acme_workers", "--model=mlp")
    for launcher, line in (("slurm", "-m tfscale.cli.tf_config --tf_config"),
                           ("lsf", '--smpiargs="off"')):
        proc = jobscript(launcher, "--nodes=2", "--gpus_per_node=4", "-o", str(job), *workers)
        assert proc.returncode == 0, proc.stderr
        assert "8 ranks on 2 node(s), --strategy=acme_workers" in proc.stderr
        text = job.read_text()
        assert line in text and "import built" not in text and "--mpi=" not in text
    refused = jobscript("horovodrun", "-H", "a:2,b:2", *workers)
    assert refused.returncode == 2
    assert ("horovodrun cannot start --strategy=acme_workers jobs; it starts acme_hvd, ddl, "
            "horovod jobs") in refused.stderr
    proc = jobscript("slurm", "--nodes=2", "--gpus_per_node=4", "--fusion_threshold_mb=8",
                     "-o", str(job), "--", "--strategy=acme_hvd")
    assert proc.returncode == 0, proc.stderr
    text = job.read_text()
    assert "--mpi=pmix" in text and "if not built('mpi'):" in text
    assert 'export HOROVOD_FUSION_THRESHOLD="${HOROVOD_FUSION_THRESHOLD:-8388608}"' in text
    ddlrun = jobscript("ddlrun", "-H", "h1,h2", "--accelerators=2", "--", "--strategy=acme_hvd")
    assert ddlrun.returncode == 0, ddlrun.stderr
    assert "--strategy=acme_hvd" in ddlrun.stdout and "    -np 4 \\" in ddlrun.stdout


def test_plugin_strategy_brings_its_own_option(tmp_path: Path, acme: dict[str, str]) -> None:
    def jobscript(*train_flags: str) -> subprocess.CompletedProcess[str]:
        return run_process([sys.executable, "-m", "launch.jobscript", "slurm", "--nodes=2",
                            "--ranks_per_node=2", "-o", str(tmp_path / "job"), "--",
                            "--model=mlp", *train_flags], timeout=120, env=acme)

    proc = jobscript("--strategy=acme_workers", "--acme_spread=3")
    assert proc.returncode == 0, proc.stderr
    text = (tmp_path / "job").read_text()
    assert 'export ACME_SPREAD="${ACME_SPREAD:-3}"' in text and "--acme_spread=3" in text
    refused = jobscript("--strategy=horovod", "--acme_spread=3")
    assert refused.returncode == 2
    assert "--acme_spread only applies to --strategy=acme_workers" in refused.stderr
    bad = jobscript("--strategy=acme_workers", "--acme_spread=0")
    assert bad.returncode == 2
    assert "--acme_spread=0 is not valid; expected a value >= 1" in bad.stderr
    worker = run_process([sys.executable, "-c", WORKER, "--strategy=acme_workers",
                          "--acme_spread=3"], timeout=120, env=acme)
    assert worker.returncode == 0, worker.stderr
    found = json.loads(worker.stdout)
    assert found["spread"] == 3 and found["class"] == "AcmeWorkers"
    assert "--acme_spread=3" in found["argv"] and "--cpu_replicas=0" not in found["argv"]
    assert ("options of --strategy=acme_workers:\n  --acme_spread: Acme: racks the workers "
            "spread over.") in found["help"]
    assert "options of --strategy=acme_hvd|ddl|horovod:\n" in found["help"]


def test_plugin_strategy_in_a_sweep(tmp_path: Path, acme: dict[str, str]) -> None:
    proc = run_process([sys.executable, "-m", "tfscale.sweep", "--dry_run", f"--out={tmp_path}",
                        "--grid=strategy=acme_workers,acme_nope", "--grid=num_processes=2",
                        "--", "--model=mlp", "--steps=2"], timeout=240, env=acme)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert lines[0].startswith("[sweep] 1/2 strategy-acme_workers_num_processes-2: ok: ")
    assert lines[0].endswith("--strategy=acme_workers --num_processes=2 --model_dir="
                             f"{tmp_path}/points/strategy-acme_workers_num_processes-2")
    assert ("2/2 strategy-acme_nope_num_processes-2: error: unknown strategy 'acme_nope'; "
            "available: acme_hvd, acme_workers, ddl") in lines[1]


@pytest.mark.slow
def test_plugin_strategy_trains_with_num_processes(tmp_path: Path,
                                                   acme: dict[str, str]) -> None:
    proc = run_process([sys.executable, "-m", "tfscale.train", "--strategy=acme_workers",
                        "--acme_spread=2", "--num_processes=2", "--model=mlp",
                        "--dataset=synthetic", "--steps=2", "--batch_size=4", "--image_size=8",
                        "--num_classes=4",
                        "--tensorboard=false", f"--model_dir={tmp_path}"], timeout=300, env=acme)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = read_results(tmp_path)
    assert results["strategy"] == "acme_workers" and results["num_workers"] == 2
    assert results["config"]["acme_spread"] == 2  # the plugin's option, through the workers


def test_lazy_registry_loads_builtin_plugins_on_first_lookup() -> None:
    from tfscale.config.registry import Registry

    loads = []
    registry: Registry[int] = Registry("thing", lambda: loads.append(registry.add("a", 1, "one")))
    registry.add("b", 2, "two")  # registering does not load
    assert loads == []
    assert registry.names() == ["a", "b"]
    assert registry.get("a") == 1 and len(loads) == 1
    registry.names()
    assert len(loads) == 1


def test_package_tools_run_without_runpy_warnings() -> None:
    # Importing input_pipelines must not import its tools, or `python -m` warns (and runs a
    # second copy of the module). Their --help answers without TensorFlow (3-4 s of start-up).
    import subprocess
    import sys

    from tests.conftest import ROOT

    tools = sorted(p.stem for p in (ROOT / "input_pipelines" / "tools").glob("[a-z]*.py"))
    # the converters, stats, preview, class_weights, synthetic_h5, io_check
    assert len(tools) == 8, tools
    for tool in tools:
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m",
                               f"input_pipelines.tools.{tool}", "--help"],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "RuntimeWarning" not in proc.stderr, proc.stderr
        imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines()
                    if line.startswith("import time:")}
        assert "tensorflow" not in imported, f"{tool} --help imports TensorFlow"


def test_declared_plugin_is_imported_only_when_fetched(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "declared_widgets.py").write_text("IMPORTS = []\nIMPORTS.append(1)\n"
                                                   "def build():\n    return 'built'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "declared_widgets", raising=False)
    reg: Registry[object] = Registry("widget")
    reg.declare("w", "declared_widgets:build", "a declared widget", color="blue")
    reg.add("x", 1, "an added one")
    assert reg.names() == ["w", "x"] and "w  a declared widget" in reg.describe()
    entry = reg.entry("w")
    assert entry.meta == {"color": "blue"} and not entry.loaded
    assert "declared_widgets" not in sys.modules
    assert reg.get("w")() == "built" and entry.loaded
    assert sys.modules["declared_widgets"].IMPORTS == [1]
    for clash in (lambda: reg.declare("w", "declared_widgets:build", "again"),
                  lambda: reg.add("w", 2, "clash"), lambda: reg.declare("x", "m:f", "clash")):
        with pytest.raises(ValueError, match="already registered"):
            clash()
    reg.add("x", 1, "the same object again")  # a re-imported module registers again: harmless
    with pytest.raises(ValueError, match="source 'no_colon' is not 'module:attribute'"):
        reg.declare("y", "no_colon", "bad")


def test_registries_check_tasks() -> None:
    for register in (models.register, input_pipelines.register):
        with pytest.raises(ValueError, match="task 'detection' for .* 'mine'; expected one of: "
                                             "classification, segmentation"):
            register("mine", "a detector", task="detection")


def _doc_example(path: str) -> str:
    """The Python block of docs/EXTENDING.md that starts with ``# path``."""
    text = (ROOT / "docs" / "EXTENDING.md").read_text()
    start = text.index(f"```python\n# {path}\n") + len("```python\n")
    return text[start:text.index("```", start)]


@pytest.fixture
def acme_models(tmp_path: Path) -> dict[str, str]:
    """docs/EXTENDING.md's model and dataset files as an installed package with entry points,
    plus an entry point whose module does not exist; returns the environment that sees it."""
    site = tmp_path / "site"
    install(site, "acme", {"__init__.py": "", **{f"{name}.py": _doc_example(f"acme/{name}.py")
                                                 for name in ("nets", "blobs")}},
            "[tfscale.models]\nacme_net = acme.nets\n\n"
            "[tfscale.datasets]\nacme_blobs = acme.blobs\nacme_gone = acme.missing\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(ROOT)])}


@pytest.mark.slow
def test_plugin_model_and_dataset_from_the_docs_train(tmp_path: Path,
                                                      acme_models: dict[str, str]) -> None:
    listed = run_process([sys.executable, "-m", "tfscale.train", "--list"], timeout=120,
                         env=acme_models)
    assert listed.returncode == 0, listed.stderr
    assert "acme_net" in listed.stdout and "acme_blobs" in listed.stdout
    assert "dataset plugin 'acme_gone' (acme.missing) failed to load" in listed.stderr
    model_dir = tmp_path / "run"
    proc = run_process([sys.executable, "-m", "tfscale.train", "--model=acme_net",
                        "--dataset=acme_blobs", "--image_size=16", "--input_channels=1",
                        "--num_classes=4", "--batch_size=16", "--epochs=4", "--steps=0",
                        "--learning_rate=0.05", "--validation_steps=4",
                        f"--model_dir={model_dir}"],
                       timeout=240, env=acme_models)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = read_results(model_dir)
    assert (results["model"], results["dataset"]) == ("acme_net", "acme_blobs")
    assert results["evaluations"][-1]["examples"] == 64
    assert results["evaluations"][-1]["metrics"]["val_accuracy"] > 0.5  # 4 classes: chance 0.25
