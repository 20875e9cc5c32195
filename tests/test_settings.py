"""Each plugin is handed its settings, not the whole configuration (tfscale/config/settings.py).

The built-in plugins read nothing outside their settings: pyproject.toml turns the warning
that an old plugin's read gives into an error, so every test that builds a built-in model,
dataset or strategy checks it.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Any

import pytest

import input_pipelines
import models
from tfscale.cluster.shard import Shard
from tfscale.config.options import Option
from tfscale.config.settings import (
    DataSettings,
    ModelSettings,
    StrategySettings,
    UndeclaredSettingWarning,
    configuration,
)
from tfscale.config.train_config import TrainConfig
from tfscale.strategies import STRATEGIES

WIDTH = Option("toy_width", 4, "the toy model's width", minimum=1)


@pytest.fixture
def toy_model() -> Any:
    """A model plugin that records what it was handed, registered for one test."""
    handed: list[Any] = []

    def build(settings: Any) -> Any:
        handed.append(settings)
        return settings

    models.register("toy_for_settings", "records its settings", task="classification",
                    options=(WIDTH,))(build)
    yield handed
    del models.MODELS._entries["toy_for_settings"]


def test_a_model_is_handed_its_settings_and_options_only(toy_model: list[Any]) -> None:
    config = TrainConfig(model="toy_for_settings", toy_width=8, image_size=32, num_classes=3,
                         strategy="horovod", fusion_threshold_mb=16, learning_rate=0.5)
    models.MODELS.get("toy_for_settings")(config)
    settings = toy_model[0]
    assert type(settings) is ModelSettings
    assert (settings.model, settings.num_classes, settings.image_size,
            settings.input_channels) == ("toy_for_settings", 3, 32, 3)
    # Its own option, and not the strategy's.
    assert dict(settings.options) == {"toy_width": 8} and WIDTH.of(settings) == 8
    fusion = STRATEGIES.get("horovod").options[0]
    with pytest.raises(LookupError, match=rf"--{fusion.name} is not an option of model "
                                          r"'toy_for_settings'"):
        fusion.of(settings)
    # What the model is not handed cannot change what it builds.
    other = config.replace(learning_rate=0.01, batch_size=7, steps=3, strategy="default")
    assert ModelSettings.of(other) == settings and hash(ModelSettings.of(other)) == hash(settings)
    assert ModelSettings.of(config.replace(toy_width=2)) != settings


def test_an_old_plugin_reading_the_whole_config_still_runs_with_a_warning(
        toy_model: list[Any]) -> None:
    models.MODELS.get("toy_for_settings")(TrainConfig(model="toy_for_settings", batch_size=7))
    settings = toy_model[0]
    with pytest.warns(UndeclaredSettingWarning, match=r"model 'toy_for_settings' reads "
                                                      r"config.batch_size, which ModelSettings "
                                                      r"does not hold"):
        assert settings.batch_size == 7
    with pytest.raises(AttributeError, match="has no attribute 'no_such_field'"):
        settings.no_such_field  # noqa: B018
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert settings.image_size == 224  # a field it holds: no warning


def test_a_dataset_builder_is_handed_data_settings() -> None:
    config = TrainConfig(dataset="synthetic", image_size=16, num_classes=5, batch_size=2,
                         synthetic_batches=3, learning_rate=0.3)
    batches = input_pipelines.PIPELINES.get("synthetic")(config, Shard(), "train", 2)
    images, labels = next(iter(batches.dataset))
    assert images.shape == (2, 16, 16, 3) and int(max(labels)) < 5
    settings = DataSettings.of(config)
    assert dict(settings.options) == {"synthetic_batches": 3}
    assert "learning_rate" not in {field.name for field in dataclasses.fields(settings)}
    # Settings are handed on as they are; a replaced field reaches the configuration too.
    assert DataSettings.of(settings) is settings
    smaller = settings.replace(image_size=8)
    assert smaller.image_size == 8 and configuration(smaller).image_size == 8
    with pytest.raises(ValueError, match="DataSettings holds no 'learning_rate'"):
        settings.replace(learning_rate=1.0)
    with pytest.raises(TypeError, match="ModelSettings cannot be made from DataSettings"):
        ModelSettings.of(settings)


def test_a_strategy_holds_its_settings_and_its_class_options() -> None:
    config = TrainConfig(strategy="horovod", fusion_threshold_mb=16, num_processes=2,
                         learning_rate=0.5, steps=3)
    strategy = STRATEGIES.get("horovod")(config)
    assert type(strategy.config) is StrategySettings
    assert strategy.config.num_processes == 2
    assert strategy.config.options["fusion_threshold_mb"] == 16.0
    assert set(strategy.config.options) == {o.name for o in type(strategy).options}
    # tfscale.prepare rebuilds the run around a strategy from the configuration it came from.
    assert configuration(strategy.config) == config
