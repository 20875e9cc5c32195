"""Which metrics a run reports, when it evaluates, and ``--target_metric``: pure functions of
the config, so that a bad target fails before any worker starts (and before TensorFlow loads).

Evaluation (on the validation split, see :mod:`tfscale.training.evaluation`) is on when
``--validation_steps`` > 0 (at most that many batches per worker; the only way to evaluate on
unbounded data such as ``synthetic``), or when ``--data_dir`` holds a validation split (which
the caller learns from :func:`input_pipelines.has_validation_split`: ``validation-*`` files, a
``validation/`` folder, Caffe's ``*val*_lmdb``), which is then read whole. Otherwise it is off,
and ``--eval_every``, ``--eval_only`` and a ``val_`` target are errors.

A target is ``NAME:VALUE[:min|max]``: training stops once metric ``NAME`` is at least (``max``)
or at most (``min``) ``VALUE``. The direction defaults to ``min`` for names containing
``loss`` and ``max`` otherwise.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tfscale.config.tasks import CLASSIFICATION, SEGMENTATION

if TYPE_CHECKING:
    from tfscale.config.train_config import TrainConfig

DIRECTIONS = ("min", "max")
TOP5_MIN_CLASSES = 6  # top-5 accuracy is reported when it is not trivially 1


@dataclasses.dataclass(frozen=True)
class Target:
    """A metric value to train to."""

    metric: str
    value: float
    direction: str

    def reached(self, value: float) -> bool:
        """True when ``value`` meets the target (NaN never does)."""
        return value <= self.value if self.direction == "min" else value >= self.value

    def describe(self) -> str:
        return f"{self.metric} {'<=' if self.direction == 'min' else '>='} {self.value:g}"


def parse_target(text: str) -> Target | None:
    """``NAME:VALUE[:min|max]`` as a :class:`Target`; None for an empty string.

    Raises:
        ValueError: naming the flag, the value and the expected form.
    """
    if not text:
        return None
    parts = text.split(":")
    form = "expected NAME:VALUE[:min|max], e.g. val_accuracy:0.95"
    if len(parts) not in (2, 3) or not parts[0]:
        raise ValueError(f"--target_metric={text!r}: {form}")
    try:
        value = float(parts[1])
    except ValueError:
        raise ValueError(f"--target_metric={text!r}: {parts[1]!r} is not a number; "
                         f"{form}") from None
    if len(parts) == 3:
        if parts[2] not in DIRECTIONS:
            raise ValueError(f"--target_metric={text!r}: direction {parts[2]!r} is not valid; "
                             f"choose one of: {', '.join(DIRECTIONS)}")
        direction = parts[2]
    else:
        direction = "min" if "loss" in parts[0] else "max"
    return Target(parts[0], value, direction)


def evaluation_enabled(config: TrainConfig, has_validation: bool) -> bool:
    """Whether the run evaluates on the validation split (see the module docstring);
    ``has_validation``: whether ``--data_dir`` holds one."""
    return config.validation_steps > 0 or has_validation


def reported_metrics(task: str, num_classes: int, evaluation: bool) -> list[str]:
    """The metric names a run of ``task`` reports in its epoch logs and results.json.

    Raises:
        ValueError: for an unknown task.
    """
    if task == CLASSIFICATION:
        train = ["loss", "accuracy"]
        val = ["val_loss", "val_accuracy"]
        if num_classes >= TOP5_MIN_CLASSES:
            val.append("val_top5_accuracy")
    elif task == SEGMENTATION:
        per_class = [f"iou_{c}" for c in range(num_classes)]
        train = ["loss", "accuracy", "mean_iou", *per_class]
        val = ["val_loss", "val_accuracy", "val_mean_iou", *(f"val_{n}" for n in per_class)]
    else:
        raise ValueError(f"no metrics for task {task!r}")
    return train + (val if evaluation else [])


def check_evaluation(config: TrainConfig, task: str, has_validation: bool) -> Target | None:
    """Checks the evaluation flags and the target against what this config reports
    (``has_validation``: whether ``--data_dir`` holds a validation split).

    Returns:
        The parsed target, or None when there is none.

    Raises:
        ValueError: one line naming the bad flag and, for a bad target, the metrics reported.
    """
    evaluation = evaluation_enabled(config, has_validation)
    if not evaluation:
        for flag, given in (("eval_every", config.eval_every), ("eval_only", config.eval_only)):
            if given:
                raise ValueError(
                    f"--{flag} needs validation data: give --validation_steps > 0, or a "
                    f"--data_dir with a validation split (validation-* files, a validation/ "
                    f"folder or Caffe's *val*_lmdb) "
                    f"(--data_dir={config.data_dir!r})")
    target = parse_target(config.target_metric)
    if target is None:
        return None
    names = reported_metrics(task, config.num_classes, evaluation)
    if target.metric not in names:
        hint = "" if evaluation else " (val_ metrics need validation data)"
        raise ValueError(f"--target_metric={config.target_metric!r}: {target.metric!r} is not "
                         f"reported{hint}; choose one of: {', '.join(names)}")
    return target
