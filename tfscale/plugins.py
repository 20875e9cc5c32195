"""Checks of a config against the plugin registries, before any worker starts."""

from __future__ import annotations

import warnings

import input_pipelines
import models
from tfscale.class_weights import parse_class_weights
from tfscale.config import TrainConfig
from tfscale.strategies import STRATEGIES, strategies_that, unread_flags
from tfscale.targets import check_evaluation


def describe_all() -> str:
    """The registered models, datasets and strategies with their descriptions."""
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
    strategy = STRATEGIES.get(config.strategy)
    model_task, data_task = models.task_of(config.model), input_pipelines.task_of(config.dataset)
    if model_task != data_task:
        fitting = [e.name for e in input_pipelines.PIPELINES if e.meta["task"] == model_task]
        raise ValueError(f"--model={config.model} is a {model_task} model but "
                         f"--dataset={config.dataset} is {data_task} data; use one of: "
                         f"{', '.join(fitting)}")
    parse_class_weights(config.class_weights, config.num_classes)
    check_evaluation(config, model_task)
    _warn_ignored_tuning_flags(config)
    strategy.check_environment()
    if config.num_processes > 1 and not strategy.multi_process():
        several = strategies_that(lambda cls: cls.multi_process())
        raise ValueError(f"--strategy={config.strategy} runs in one process; --num_processes="
                         f"{config.num_processes} needs a multi-process strategy "
                         f"({', '.join(several)})")


def _warn_ignored_tuning_flags(config: TrainConfig) -> None:
    """Warns when another strategy's tuning flags (Horovod's communication knobs, say) are
    given to a strategy that ignores them; one warning per group of strategies."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for flag, readers in unread_flags(config, "tuning_flags").items():
        groups.setdefault(tuple(readers), []).append(f"--{flag}")
    for group, given in groups.items():
        warnings.warn(f"{', '.join(given)} only affect the strategies that read them "
                      f"({', '.join(group)}); --strategy={config.strategy} ignores them",
                      stacklevel=2)
