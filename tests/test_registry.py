"""Registries: registration, lookup, errors that list names, strategy plugins."""

from __future__ import annotations

from pathlib import Path

import pytest

import input_pipelines
import models
from tfscale.registry import Registry, UnknownNameError


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
    from tfscale.config import TrainConfig
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

    package = tmp_path / "acme_strategy"
    package.mkdir()
    (package / "__init__.py").write_text(
        "from tfscale.strategies import SingleProcessStrategy\n\n"
        "class AcmeStrategy(SingleProcessStrategy):\n"
        '    """Acme\'s in-house strategy."""\n')
    dist = tmp_path / "acme_strategy-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: acme-strategy\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[tfscale.strategies]\nacme = acme_strategy:AcmeStrategy\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_plugins_loaded", False)
    try:
        registry.load_plugins()
        assert STRATEGIES.entry("acme").description == "Acme's in-house strategy."
        assert STRATEGIES.get("acme").__name__ == "AcmeStrategy"
    finally:
        STRATEGIES._entries.pop("acme", None)


def test_lazy_registry_loads_builtin_plugins_on_first_lookup() -> None:
    from tfscale.registry import Registry

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
    # second copy of the module).
    import subprocess
    import sys

    from tests.conftest import ROOT

    tools = sorted(p.stem for p in (ROOT / "input_pipelines" / "tools").glob("[a-z]*.py"))
    assert len(tools) == 6, tools
    for tool in tools:
        proc = subprocess.run([sys.executable, "-m", f"input_pipelines.tools.{tool}", "--help"],
                              cwd=ROOT, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        assert "RuntimeWarning" not in proc.stderr, proc.stderr
