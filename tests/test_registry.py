"""Registries: registration, lookup, errors that list names, strategy plugins."""

from __future__ import annotations

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
