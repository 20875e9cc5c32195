"""The shape of the tree: what may import what.

The import graph is read from the source with ``ast`` (nothing is imported), over every module of
``tfscale/``, ``models/``, ``input_pipelines/`` and ``launch/``:

- every ``import`` and ``from ... import`` is an edge, at module level and inside functions
  (a lazy import still makes the importer depend on the imported module), and so is
  ``importlib.import_module("a.literal.name")``;
- ``from pkg import name`` is an edge to ``pkg.name`` when that is a module, else to the module
  ``pkg/__init__.py`` re-exports ``name`` from (followed through further re-exports), else to
  ``pkg`` itself;
- importing ``a.b.c`` runs ``a/__init__.py`` and ``a/b/__init__.py`` first, so it is also an
  edge to each enclosing package the importer is not itself inside. Inside a package, its
  ``__init__`` is already running, so a package that re-exports its submodules is not in a
  cycle with them unless a submodule imports a name the ``__init__`` defines itself. Outside,
  the edge is real: ``import tfscale.horovod.runtime`` ran ``tfscale/horovod/__init__.py``,
  which imported the callbacks, which imported ``tfscale.horovod.runtime``;
- imports under ``if TYPE_CHECKING:`` never run: they are left out of the cycle check (types
  may name each other), but kept for the layering rules (the core must not know the layers
  above it, even by type).
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("tfscale", "models", "input_pipelines", "launch")
# What tfscale trains (the model zoo, the input pipelines) sits above it, and so do the job
# scripts (launch): only the commands import the zoo and the pipelines, to hand the trainer what
# it trains (tfscale.cli.plugins.parts), and nothing in tfscale imports launch.
COMMANDS = "tfscale.cli"
TRAINED = ("models", "input_pipelines")
# The packages of tfscale by role, and the others each may import (its own always): the
# architecture, from the bottom up. tfscale.cli, the commands, may import all of them.
MAY_IMPORT: dict[str, tuple[str, ...]] = {
    "tfscale.cluster": (),  # who am I, who are my peers, where do I run
    "tfscale.config": (),  # options, registries, the frozen config: data modules
    "tfscale.exchange": ("tfscale.cluster", "tfscale.config"),  # what moves gradients
    # Strategies hand out their own callbacks (broadcast, metric averaging, DDL's pair).
    "tfscale.strategies": ("tfscale.cluster", "tfscale.config", "tfscale.exchange",
                           "tfscale.callbacks"),
    "tfscale.callbacks": ("tfscale.cluster", "tfscale.config", "tfscale.exchange",
                          "tfscale.training"),
    "tfscale.training": ("tfscale.cluster", "tfscale.config", "tfscale.exchange",
                         "tfscale.strategies", "tfscale.callbacks"),
    # The forecast asks a strategy's class whose transports carry its exchange.
    "tfscale.forecast": ("tfscale.config", "tfscale.strategies", "tfscale.training"),
    # What users' scripts import, and its public faces.
    "tfscale.scripts": ("tfscale.cluster", "tfscale.config", "tfscale.exchange",
                        "tfscale.strategies", "tfscale.callbacks", "tfscale.training"),
    "tfscale.horovod": ("tfscale.cluster", "tfscale.exchange", "tfscale.callbacks",
                        "tfscale.scripts"),
    "tfscale.multiworker": ("tfscale.strategies",),
}
# tfscale's own __init__: the public face (lazily) and the old names of moved modules.
TOP = ("tfscale.config", "tfscale.scripts")

Graph = dict[str, dict[str, bool]]  # importer -> imported -> the import only type-checks


def _modules(root: Path) -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _under(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _import_nodes(node: ast.AST, typing_only: bool = False) -> Iterator[tuple[ast.AST, bool]]:
    """Every import statement (and ``importlib.import_module`` call) below ``node``, with
    whether it sits under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child):
            for stmt in child.body:
                yield from _import_nodes(ast.Module([stmt], []), True)
            for stmt in child.orelse:
                yield from _import_nodes(ast.Module([stmt], []), typing_only)
            continue
        if isinstance(child, ast.Import | ast.ImportFrom | ast.Call):
            yield child, typing_only
        yield from _import_nodes(child, typing_only)


class _Resolver:
    def __init__(self, root: Path = ROOT) -> None:
        self.files = _modules(root)
        self.trees = {m: ast.parse(p.read_text(), str(p)) for m, p in self.files.items()}

    def is_package(self, module: str) -> bool:
        return self.files[module].name == "__init__.py"

    def known(self, name: str) -> str | None:
        """The longest prefix of dotted ``name`` that is a module of the tree."""
        while name and name not in self.files:
            name = name.rpartition(".")[0]
        return name or None

    def absolute(self, importer: str, node: ast.ImportFrom) -> str:
        if not node.level:
            return node.module or ""
        package = importer.split(".") if self.is_package(importer) else importer.split(".")[:-1]
        base = package[: len(package) - node.level + 1]
        return ".".join(base + ([node.module] if node.module else []))

    def source_of(self, package: str, name: str, seen: frozenset[str] = frozenset()) -> str:
        """The module that defines ``name`` as ``from package import name`` sees it."""
        if f"{package}.{name}" in self.files:
            return f"{package}.{name}"
        if package in seen or not self.is_package(package):
            return package
        for stmt in self.trees[package].body:
            if isinstance(stmt, ast.ImportFrom):
                for alias in stmt.names:
                    if (alias.asname or alias.name) == name:
                        origin = self.known(self.absolute(package, stmt))
                        if origin is None:
                            return package
                        return self.source_of(origin, alias.name, seen | {package})
        return package

    def targets(self, importer: str, node: ast.AST) -> list[str]:
        """The tree's modules an import statement names (enclosing packages not included)."""
        if isinstance(node, ast.Import):
            return [m for a in node.names if (m := self.known(a.name))]
        if isinstance(node, ast.ImportFrom):
            base = self.known(self.absolute(importer, node))
            if base is None:
                return []
            if base != self.absolute(importer, node):  # ``from pkg.mod.attr import x``
                return [base]
            return [self.source_of(base, a.name) for a in node.names if a.name != "*"] or [base]
        assert isinstance(node, ast.Call)
        func, args = node.func, node.args
        if (isinstance(func, ast.Attribute) and func.attr == "import_module" and args
                and isinstance(args[0], ast.Constant) and isinstance(args[0].value, str)):
            return [m for m in [self.known(args[0].value)] if m]
        return []

    def graph(self) -> Graph:
        edges: Graph = {m: {} for m in self.files}
        for importer, tree in self.trees.items():
            for node, typing_only in _import_nodes(tree):
                for target in self.targets(importer, node):
                    parts = target.split(".")
                    enclosing = [".".join(parts[:i]) for i in range(1, len(parts))]
                    for module in [target, *enclosing]:
                        if module == importer or (module in enclosing
                                                  and _under(importer, module)):
                            continue
                        was = edges[importer].get(module, True)
                        edges[importer][module] = was and typing_only
        return edges


@pytest.fixture(scope="module")
def graph() -> Graph:
    return _Resolver().graph()


def _cycles(edges: Graph) -> list[list[str]]:
    """One cycle through each strongly connected group of modules (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(module: str) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for other in edges[module]:
            if other not in index:
                visit(other)
                low[module] = min(low[module], low[other])
            elif other in stack:
                low[module] = min(low[module], index[other])
        if low[module] == index[module]:
            group = set()
            while True:
                member = stack.pop()
                group.add(member)
                if member == module:
                    break
            if len(group) > 1:
                groups.append(group)

    for module in sorted(edges):
        if module not in index:
            visit(module)
    cycles = []
    for group in groups:
        start = min(group)
        paths = {start: [start]}
        queue = [start]
        while queue:  # breadth first, for the shortest way back to start
            module = queue.pop(0)
            for other in sorted(edges[module]):
                if other == start:
                    cycles.append(paths[module] + [start])
                    queue = []
                    break
                if other in group and other not in paths:
                    paths[other] = paths[module] + [other]
                    queue.append(other)
    return cycles


LAZY = "    from tfscale.facade.runtime import helper\n"


@pytest.mark.parametrize("body", [LAZY, "    if TYPE_CHECKING:\n    " + LAZY],
                         ids=["in_function", "type_checking"])
def test_import_graph_sees_lazy_imports_and_package_inits(body: str, tmp_path: Path) -> None:
    # The shape of the old Horovod cycle, in miniature: a facade package re-exports a
    # callback; the callback's layer lazily imports a helper that lives in the facade package,
    # which runs the facade's __init__. The rules below are only as good as this reader.
    files = {
        "tfscale/__init__.py": "",
        "tfscale/facade/__init__.py": "from tfscale.facade.cb import CB\n",
        "tfscale/facade/cb.py": "from tfscale.mid import M\nCB = M\n",
        "tfscale/facade/runtime.py": "def helper() -> None: ...\n",
        "tfscale/mid/__init__.py": "from tfscale.mid.m import M\n",
        "tfscale/mid/m.py": "from typing import TYPE_CHECKING\nM = 1\ndef f() -> None:\n" + body,
    }
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    edges = _Resolver(tmp_path).graph()
    assert edges["tfscale.facade.cb"] == {"tfscale.mid.m": False, "tfscale.mid": False}
    cycles = _cycles(_runtime(edges))
    if "TYPE_CHECKING" in body:
        assert cycles == []
    else:
        assert cycles == [["tfscale.facade", "tfscale.facade.cb", "tfscale.mid.m",
                           "tfscale.facade"]]


def _runtime(edges: Graph) -> Graph:
    return {m: {t: False for t, typing_only in to.items() if not typing_only}
            for m, to in edges.items()}


def test_no_import_cycle(graph: Graph) -> None:
    cycles = _cycles(_runtime(graph))
    assert not cycles, "import cycles:\n" + "\n".join(" -> ".join(c) for c in cycles)


def _role(module: str) -> str:
    """The package of tfscale a module belongs to (``tfscale`` for its ``__init__``)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "tfscale" else parts[0]


def test_only_the_commands_import_what_tfscale_trains_and_none_imports_launch(
        graph: Graph) -> None:
    bad = sorted(f"{m} imports {t}" for m, to in graph.items() for t in to
                 if _under(m, "tfscale") and (
                     _under(t, "launch")
                     or (any(_under(t, p) for p in TRAINED) and not _under(m, COMMANDS))))
    assert not bad, (f"only {COMMANDS} may import {TRAINED}, and nothing in tfscale imports "
                     "launch:\n" + "\n".join(bad))


def test_every_package_of_tfscale_imports_only_what_its_role_allows(graph: Graph) -> None:
    roles = {_role(m) for m in graph if _under(m, "tfscale")}
    assert roles == {*MAY_IMPORT, COMMANDS, "tfscale"}, (
        f"packages of tfscale without a role here: {sorted(roles - {*MAY_IMPORT, COMMANDS})}")
    bad = []
    for module, targets in graph.items():
        role = _role(module)
        # A package's __main__ (python -m tfscale.forecast) hands over to its command.
        if not _under(module, "tfscale") or role == COMMANDS or module.endswith(".__main__"):
            continue
        allowed = TOP if role == "tfscale" else MAY_IMPORT[role]
        bad += [f"{module} imports {t}" for t in targets
                if _under(t, "tfscale") and _role(t) not in (role, *allowed)]
    assert not bad, "an import across the layers of tfscale:\n" + "\n".join(sorted(bad))


# The plugins' own code is handed settings (tfscale.config.settings), never the whole
# configuration, not even by type. Apart: the registries, reading a data folder's shape (for
# the flags' defaults) and the strategies' base class, which makes a strategy's settings.
PLUGIN_CODE = (Path("models"), Path("input_pipelines", "datasets"),
               Path("input_pipelines", "core"), Path("tfscale", "strategies"))
CONFIG_READERS = (Path("models", "registry.py"), Path("input_pipelines", "core", "data_shape.py"),
                  Path("tfscale", "strategies", "registry.py"),
                  Path("tfscale", "strategies", "base.py"))


def test_plugins_are_handed_settings_not_the_configuration() -> None:
    bad = []
    for folder in PLUGIN_CODE:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path.relative_to(ROOT) in CONFIG_READERS:
                continue
            for node, _ in _import_nodes(ast.parse(path.read_text())):
                names = [a.name for a in getattr(node, "names", ())]
                if "TrainConfig" in names:
                    bad.append(str(path.relative_to(ROOT)))
    assert not bad, f"plugin code that knows the whole configuration: {bad}"


def test_tfscale_top_level_is_the_public_face() -> None:
    entries = sorted(p.name for p in (ROOT / "tfscale").iterdir()
                     if p.name != "__pycache__" and (p.suffix == ".py" or p.is_dir()))
    assert len(entries) <= 12, entries
    assert entries == ["__init__.py", "callbacks", "cli", "cluster", "config", "exchange",
                       "forecast", "horovod", "multiworker.py", "scripts", "strategies",
                       "training"], entries


def test_entry_points_live_in_the_commands_package() -> None:
    # A module that runs as a command (``if __name__ == "__main__"``, absl's ``app.run``) is
    # one of tfscale.cli's; elsewhere only a package's ``__main__`` hands over to it.
    found = []
    for path in sorted((ROOT / "tfscale").rglob("*.py")):
        module = ".".join(path.relative_to(ROOT).with_suffix("").parts)
        if _under(module, COMMANDS) or path.name == "__main__.py":
            continue
        text = path.read_text()
        if '__name__ == "__main__"' in text or "app.run(" in text:
            found.append(module)
    assert not found, f"entry points outside {COMMANDS}: {found}"


def test_exchange_cluster_and_config_import_no_tensorflow_keras_or_horovod() -> None:
    # Reading a strategy class (for --help, job scripts) must not load TensorFlow.
    code = ("import sys, tfscale.exchange, tfscale.cluster.shard, tfscale.config.train_config; "
            "print(sorted(m for m in ('tensorflow', 'keras', 'horovod') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


# --- A strategy is the single owner of what it is -------------------------------------------

# Where other code may not name a strategy: it asks the strategy's class through the registry.
NAME_FREE = ("tfscale", "launch", "models", "input_pipelines")


def _strategy_name_literals(root: Path, names: set[str]) -> list[str]:
    """``path:line: 'name'`` for each string constant equal to one of ``names`` in the Python
    files under ``NAME_FREE`` (``tfscale/strategies/`` excepted: the strategies name
    themselves there, and export constants such as ``DDL_STRATEGY`` for the others). One
    declaration outside is the config's: the default of ``--strategy``
    (``DEFAULT_STRATEGY = ...``, which that strategy registers itself under)."""
    found = []
    for package in NAME_FREE:
        for path in sorted((root / package).rglob("*.py")):
            relative = path.relative_to(root)
            if relative.parts[:2] == ("tfscale", "strategies"):
                continue
            tree = ast.parse(path.read_text(), str(path))
            default = {id(node.value) for node in ast.walk(tree)
                       if isinstance(node, ast.Assign) and relative == CONFIG_MODULE
                       and [getattr(t, "id", "") for t in node.targets] == ["DEFAULT_STRATEGY"]}
            for node in ast.walk(tree):
                if (isinstance(node, ast.Constant) and node.value in names
                        and id(node) not in default):
                    found.append(f"{relative}:{node.lineno}: {node.value!r}")
    return found


CONFIG_MODULE = Path("tfscale", "config", "train_config.py")


def test_strategy_name_finder_sees_literals_outside_the_strategies(tmp_path: Path) -> None:
    files = {"launch/jobs/lsf.py": 'if strategy == "multiworker":\n    pass\n',
             "tfscale/strategies/mine.py": 'NAME = "multiworker"\n',
             "tfscale/config/train_config.py":
                 'HELP = "--strategy=multiworker runs a process per worker"\n'}
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    assert _strategy_name_literals(tmp_path, {"multiworker"}) == [
        "launch/jobs/lsf.py:1: 'multiworker'"]


def test_no_strategy_name_strings_outside_strategies() -> None:
    from tfscale.strategies import STRATEGIES

    found = _strategy_name_literals(ROOT, set(STRATEGIES.names()))
    assert not found, ("ask the strategy's class (tfscale.strategies.STRATEGIES.get(name)) "
                       "instead of comparing its name:\n" + "\n".join(found))


def test_strategies_and_job_scripts_load_no_tensorflow(tmp_path: Path) -> None:
    # Reading every strategy's description and writing job scripts for them stays light:
    # TensorFlow, Keras and Horovod load only in the processes that train.
    code = f"""
import sys
from launch.jobscript import main
from tfscale.config.train_config import TrainConfig
from tfscale.strategies import STRATEGIES
for name in STRATEGIES.names():
    cls = STRATEGIES.get(name)
    cls.multi_process(), cls.flags(), cls.rendezvous, cls.one_rank_per_gpu
    cls.environment(TrainConfig(strategy=name, fusion_threshold_mb=1))
    if cls.multi_process():
        assert main(["slurm", "--nodes=2", "-o", {str(tmp_path / "job")!r}, "--",
                     "--strategy=" + name]) == 0
print(sorted(m for m in ("tensorflow", "keras", "horovod") if m in sys.modules))
"""
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "[]"


# --- TensorFlow only when needed ----------------------------------------------------------

# Runs ``python -m MODULE ARGS`` in this process, then prints which of the heavy modules it
# loaded. A fake interpreter path (FAKE_WORKER) replaces sys.executable, so the local
# launcher starts that script as its workers instead of ``python -m tfscale.train``.
_RUN_AND_REPORT = """
import json, os, runpy, sys
module, *args = sys.argv[1:]
sys.argv = [module, *args]
sys.executable = os.environ.get("FAKE_WORKER", sys.executable)
try:
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    code = 0
except SystemExit as stop:
    code = stop.code if isinstance(stop.code, int) else 0 if stop.code is None else 1
heavy = ("tensorflow", "keras", "horovod", "horovod.tensorflow")
print(json.dumps({"exit": code, "loaded": [m for m in heavy if m in sys.modules]}), flush=True)
"""


def _run_light(module: str, *args: str, env: dict[str, str] | None = None
               ) -> tuple[int, list[str], str]:
    """Runs ``python -m module args`` through :data:`_RUN_AND_REPORT`: its exit code, the
    heavy modules it loaded, and its output (stdout, then stderr)."""
    proc = subprocess.run([sys.executable, "-c", _RUN_AND_REPORT, module, *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, **(env or {})})
    *output, report = proc.stdout.splitlines() or [""]
    assert report.startswith("{"), proc.stdout + proc.stderr
    result = json.loads(report)
    return result["exit"], result["loaded"], "\n".join(output) + "\n" + proc.stderr


@pytest.mark.parametrize(("args", "code", "expected"), [
    (["--help"], 0, "--model: Model to train (see --list)."),
    (["--helpshort"], 0, "--model: Model to train (see --list)."),
    (["--helpfull"], 0, "--strategy: Distribution strategy (see --list)."),
    (["--list"], 0, "tiny_cnn            2-conv CNN without batch norm, for tests"),
    (["--model=nope"], 2, "error: unknown model 'nope'; available: deeplabv3plus, "),
    (["--dataset=nope"], 2, "error: unknown dataset 'nope'; available: image_folder, "),
    (["--strategy=nope"], 2, "error: unknown strategy 'nope'; available: "),
    (["--model=deeplabv3plus_tiny"], 2, "error: --model=deeplabv3plus_tiny is a segmentation "
                                        "model but --dataset=synthetic is classification data"),
    (["--nosuchflag"], 2, "error: Unknown command line flag 'nosuchflag'"),
    (["--modle=x"], 2, "error: Unknown command line flag 'modle'. Did you mean: model, "
                       "model_dir?"),
    (["--flagfile=/nonexistent.flags"], 2, "error: Unable to open flagfile: "),
    (["--batch_size=x"], 2, "error: flag --batch_size=x: invalid literal for int()"),
    (["--target_metric=nope:1"], 2, "error: --target_metric='nope:1': 'nope' is not reported"),
    (["--data_dir=/nonexistent"], 2, "error: --data_dir=/nonexistent does not exist"),
], ids=lambda value: value[0] if isinstance(value, list) else None)
def test_train_answers_usage_without_tensorflow(args: list[str], code: int,
                                                expected: str) -> None:
    # Help, the plugin list and every usage error answer before TensorFlow would load.
    exit_code, loaded, output = _run_light("tfscale.train", *args)
    assert (exit_code, loaded) == (code, []), output
    assert expected in output, output
    if code == 2:  # bad usage: one line, whoever noticed it (absl or tfscale)
        assert output.strip().splitlines() == [next(line for line in output.splitlines()
                                                    if line.startswith("error: "))], output


def test_sweep_flag_errors_and_help_exit_like_train() -> None:
    exit_code, _, output = _run_light("tfscale.sweep", "--gird=x")
    assert (exit_code, output.strip()) == (
        2, "error: Unknown command line flag 'gird'. Did you mean: grid?"), output
    assert _run_light("tfscale.sweep", "--help")[0] == 0


def test_single_process_strategy_is_refused_under_a_launcher(tmp_path: Path) -> None:
    # mpirun -np 2 without a multi-process strategy: two separate runs into one model_dir.
    exit_code, loaded, output = _run_light(
        "tfscale.train", "--model=tiny_cnn", "--steps=1", "--image_size=16", "--batch_size=2",
        f"--model_dir={tmp_path}", env={"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"})
    assert (exit_code, loaded) == (2, []), output
    assert ("error: this process is rank 1 of 2 started by openmpi, but --strategy=default runs "
            "in one process") in output
    assert output.count("error:") == 1 and "(ddl, horovod, multiworker)" in output, output


def test_jobscript_loads_no_tensorflow(tmp_path: Path) -> None:
    job = tmp_path / "job.sbatch"
    exit_code, loaded, output = _run_light(
        "launch.jobscript", "slurm", "--nodes", "2", "--gpus_per_node", "4", "-o", str(job),
        "--", "--model", "resnet50", "--strategy", "multiworker")
    assert (exit_code, loaded) == (0, []), output
    assert "-m tfscale.train" in job.read_text() and "--strategy=multiworker" in job.read_text()


@pytest.mark.parametrize(("strategy", "launcher_needs"), [
    ("multiworker", []),
    # The Gloo rendezvous server is horovod.runner's, as under horovodrun; Horovod's
    # TensorFlow ops (horovod.tensorflow) are the workers' business.
    pytest.param("horovod", ["horovod"], marks=pytest.mark.skipif(
        importlib.util.find_spec("horovod") is None, reason="needs horovod")),
])
def test_local_launcher_parent_loads_no_tensorflow(tmp_path: Path, strategy: str,
                                                   launcher_needs: list[str]) -> None:
    worker = tmp_path / "worker"
    worker.write_text('#!/bin/sh\necho "worker $TFSCALE_LOCAL_RANK of $TFSCALE_LOCAL_SIZE '
                      'horovod_rank=$HOROVOD_RANK tf_config=${TF_CONFIG:+set}: $*"\n')
    worker.chmod(0o755)
    exit_code, loaded, output = _run_light(
        "tfscale.train", "--num_processes=2", f"--strategy={strategy}", "--model=tiny_cnn",
        env={"FAKE_WORKER": str(worker)})
    assert (exit_code, loaded) == (0, launcher_needs), output
    for rank in (0, 1):
        line = next(line for line in output.splitlines() if line.startswith(f"[{rank}] worker"))
        assert line.startswith(f"[{rank}] worker {rank} of 2 "), output
        assert "-m tfscale.train" in line and f"--strategy={strategy}" in line, line
        assert ("tf_config=set" in line) == (strategy == "multiworker"), line
        assert (f"horovod_rank={rank} " in line) == (strategy == "horovod"), line
