"""Checks of a config against the plugin registries, before any worker starts."""

from __future__ import annotations

import dataclasses
import warnings

import input_pipelines
import models
from tfscale.class_weights import parse_class_weights
from tfscale.config import TrainConfig
from tfscale.strategies import STRATEGIES, load_plugins
from tfscale.targets import check_evaluation


def describe_all() -> str:
    """The registered models, datasets and strategies with their descriptions."""
    load_plugins()
    return "\n".join(
        f"{title}:\n{registry.describe()}"
        for title, registry in (("models", models.MODELS),
                                ("datasets", input_pipelines.PIPELINES),
                                ("strategies", STRATEGIES))
    )


def validate_names(config: TrainConfig) -> None:
    """Checks that the model, dataset and strategy exist and fit together, and that the
    evaluation flags and ``--target_metric`` fit what the run reports.

    Raises:
        ValueError: naming the bad value and the valid choices.
    """
    models.MODELS.entry(config.model)
    input_pipelines.PIPELINES.entry(config.dataset)
    load_plugins()
    strategy = STRATEGIES.get(config.strategy)
    model_task, data_task = models.task_of(config.model), input_pipelines.task_of(config.dataset)
    if model_task != data_task:
        fitting = [e.name for e in input_pipelines.PIPELINES if e.meta["task"] == model_task]
        raise ValueError(f"--model={config.model} is a {model_task} model but "
                         f"--dataset={config.dataset} is {data_task} data; use one of: "
                         f"{', '.join(fitting)}")
    parse_class_weights(config.class_weights, config.num_classes)
    check_evaluation(config, model_task)
    _warn_unused_horovod_knobs(config, strategy.launcher)
    strategy.check_environment()
    if config.num_processes > 1 and not strategy.launcher:
        raise ValueError(f"--strategy={config.strategy} runs in one process; --num_processes="
                         f"{config.num_processes} needs a multi-process strategy (horovod, "
                         "multiworker, ddl)")


HOROVOD_ONLY = ("fp16_allreduce", "fusion_threshold_mb", "cycle_time_ms")


def _warn_unused_horovod_knobs(config: TrainConfig, launcher: str) -> None:
    """Warns when Horovod's communication flags are given to a strategy that ignores them."""
    if launcher == "horovod":
        return
    given = [f"--{field.name}" for field in dataclasses.fields(config)
             if field.name in HOROVOD_ONLY and getattr(config, field.name) != field.default]
    if given:
        warnings.warn(f"{', '.join(given)} only affect Horovod-based strategies (horovod, ddl); "
                      f"--strategy={config.strategy} ignores them", stacklevel=2)
