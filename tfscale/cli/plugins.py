"""The registries of what a run trains, for the commands: checks of a config against them
before any worker starts, and the :class:`~tfscale.training.parts.Parts` the trainer gets."""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Mapping

import input_pipelines
import models
from tfscale.cluster import environment as cluster_env
from tfscale.cluster import rank_zero
from tfscale.config.targets import check_evaluation
from tfscale.config.train_config import TrainConfig
from tfscale.strategies import STRATEGIES, strategies_that, unread_flags
from tfscale.training.class_weights import parse_class_weights
from tfscale.training.parts import Parts


def describe_all() -> str:
    """The registered models, datasets and strategies with their descriptions."""
    return "\n".join(
        f"{title}:\n{registry.describe()}"
        for title, registry in (("models", models.MODELS),
                                ("datasets", input_pipelines.PIPELINES),
                                ("strategies", STRATEGIES))
    )


def choose_dataset(data_dir: str, model: str) -> str:
    """The dataset for ``--data_dir`` when ``--dataset`` is left out: the one of the model's
    task whose recognizer knows what the directory holds (:func:`input_pipelines.recognize`);
    the chief says which on stderr.

    Raises:
        ValueError: for an unknown model, a missing directory, or data that no dataset or
            several recognize.
    """
    name, what = input_pipelines.recognize(data_dir, models.task_of(model))
    if rank_zero.is_chief():
        print(f"--dataset not given: --data_dir={data_dir} holds {what}; using "
              f"--dataset={name}", file=sys.stderr, flush=True)
    return name


def check_names(config: TrainConfig) -> None:
    """Checks that the model, dataset and strategy are registered and that the model and the
    dataset serve the same task: what a job script, written on another machine than the one
    that trains, can check (:func:`validate_names` checks the rest where the run starts).

    Raises:
        ValueError: naming the bad value and the valid choices.
    """
    models.MODELS.entry(config.model)
    input_pipelines.PIPELINES.entry(config.dataset)
    STRATEGIES.entry(config.strategy)
    model_task, data_task = models.task_of(config.model), input_pipelines.task_of(config.dataset)
    if model_task != data_task:
        fitting = [e.name for e in input_pipelines.PIPELINES if e.meta["task"] == model_task]
        raise ValueError(f"--model={config.model} is a {model_task} model but "
                         f"--dataset={config.dataset} is {data_task} data; use one of: "
                         f"{', '.join(fitting)}")


def validate_names(config: TrainConfig) -> None:
    """Checks that the model, dataset and strategy exist and fit together, and that the
    evaluation flags and ``--target_metric`` fit what the run reports.

    Raises:
        ValueError: naming the bad value and the valid choices.
    """
    check_names(config)
    strategy = STRATEGIES.get(config.strategy)
    model_task = models.task_of(config.model)
    _check_data_dir(config)
    parse_class_weights(config.class_weights, config.num_classes)
    check_evaluation(config, model_task,
                     input_pipelines.has_validation_split(config.data_dir, config.dataset))
    _warn_ignored_tuning_flags(config)
    strategy.check_environment()
    if config.num_processes > 1 and not strategy.multi_process():
        several = strategies_that(lambda cls: cls.multi_process())
        raise ValueError(f"--strategy={config.strategy} runs in one process; --num_processes="
                         f"{config.num_processes} needs a multi-process strategy "
                         f"({', '.join(several)})")


def check_launcher(config: TrainConfig, environ: Mapping[str, str] = os.environ) -> None:
    """Refuses a single-process strategy in one rank of a job that a cluster launcher
    (horovodrun, mpirun, srun, jsrun ...) started with several ranks: each rank would train
    its own copy into the same model_dir.

    Raises:
        ValueError: naming the launcher, the strategy and the strategies that fit.
    """
    env = cluster_env.this_process(environ)
    if env.size > 1 and not STRATEGIES.get(config.strategy).multi_process():
        several = strategies_that(lambda cls: cls.multi_process())
        raise ValueError(f"this process is rank {env.rank} of {env.size} started by "
                         f"{env.launcher}, but --strategy={config.strategy} runs in one process: "
                         f"the {env.size} ranks would train {env.size} separate copies into one "
                         f"model_dir; give a multi-process strategy ({', '.join(several)})")


def _check_data_dir(config: TrainConfig) -> None:
    """A ``--data_dir`` must exist and be read by the dataset (not ignored by generated data).

    Raises:
        ValueError: naming the directory, or the dataset and those that read files.
    """
    if not config.data_dir:
        return
    if not input_pipelines.reads_data_dir(config.dataset):
        readers = [e.name for e in input_pipelines.PIPELINES
                   if input_pipelines.reads_data_dir(e.name)]
        raise ValueError(f"--data_dir={config.data_dir} is given but --dataset={config.dataset} "
                         "generates its data and reads no files; drop --data_dir, or choose a "
                         f"dataset that reads it: {', '.join(readers)}")
    from input_pipelines.core.files import is_glob

    if not (is_glob(config.data_dir) or os.path.exists(config.data_dir)):
        raise ValueError(f"--data_dir={config.data_dir} does not exist")


def _warn_ignored_tuning_flags(config: TrainConfig) -> None:
    """Warns when another strategy's tuning flags (Horovod's communication knobs, say) are
    given to a strategy that ignores them; one warning per group of strategies."""
    groups: dict[tuple[str, ...], list[str]] = {}
    for flag, readers in unread_flags(config, "tuning").items():
        groups.setdefault(tuple(readers), []).append(f"--{flag}")
    for group, given in groups.items():
        warnings.warn(f"{', '.join(given)} only affect the strategies that read them "
                      f"({', '.join(group)}); --strategy={config.strategy} ignores them",
                      stacklevel=2)


def parts(config: TrainConfig) -> Parts:
    """The model and dataset ``config`` names, from their registries, for the trainer
    (:func:`tfscale.training.trainer.run`)."""
    return Parts(
        model=models.MODELS.get(config.model), task=models.task_of(config.model),
        data=input_pipelines.PIPELINES.get(config.dataset),
        has_validation=input_pipelines.has_validation_split(config.data_dir, config.dataset),
        reads_data=input_pipelines.reads_data_dir(config.dataset),
        block_rule=lambda: models.block_rule(config.model),
        inference=input_pipelines.inference_for)
