"""The frozen, validated training configuration.

Flags (``tfscale/cli/flags.py``) are turned into one :class:`TrainConfig` at the entry point;
library
code takes this object and never reads absl ``FLAGS``. Validation here covers values that can be
checked without importing TensorFlow, the strategy's own flags included (its class says which
they are); model and dataset names are checked against the registries by
:func:`tfscale.cli.plugins.validate_names`. A strategy's, model's or dataset's own options
(``--fusion_threshold_mb``, ``--cpu_replicas``, ``--synthetic_batches``, a plugin's) are declared
in its file (:mod:`tfscale.config.options`) and held in :attr:`TrainConfig.options`; the
constructor,
:meth:`TrainConfig.replace` and :meth:`TrainConfig.to_dict` take and give them by name beside
the fields, as the flags do.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from tfscale.config import options as plugin_options
from tfscale.config.options import Options

# The strategy a config names when none is chosen; the strategy of that name registers itself
# under it (tfscale.strategies).
DEFAULT_STRATEGY = "default"
PRECISIONS = ("fp32", "mixed_float16", "mixed_bfloat16", "auto")
XLA_MODES = ("off", "jit", "auto")
LR_SCALINGS = ("none", "linear")
LR_SCHEDULES = ("constant", "cosine", "step", "polynomial")
OPTIMIZERS = ("sgd", "nesterov", "adamw", "lamb", "lars", "larc")
LARC_MODES = ("clip", "scale")
AUGMENTS = ("auto", "imagenet", "small", "flip", "none")
FLIP_MODES = ("auto", "on", "off")
NORMALIZATIONS = ("auto", "imagenet", "dataset", "none")
BN_STATISTICS = ("auto", "ema", "precise")  # tfscale.training.bn_statistics

#: The fields with a fixed set of values: the one table that validation and the flags read.
CHOICES: dict[str, tuple[str, ...]] = {
    "precision": PRECISIONS, "xla": XLA_MODES, "lr_scaling": LR_SCALINGS,
    "lr_schedule": LR_SCHEDULES, "optimizer": OPTIMIZERS, "larc_mode": LARC_MODES,
    "augment": AUGMENTS, "horizontal_flip": FLIP_MODES, "normalization": NORMALIZATIONS,
    "bn_statistics": BN_STATISTICS,
}


@dataclasses.dataclass(frozen=True, init=False)
class TrainConfig:
    """Everything one training run needs. Build it with keyword arguments (fields and the
    plugins' options by name, or ``options={...}``); it validates itself."""

    # What to train.
    model: str = "resnet50"
    dataset: str = "synthetic"
    strategy: str = DEFAULT_STRATEGY
    num_processes: int = 1
    max_restarts: int = 0
    # Data and shapes. ``batch_size`` is per replica; the global batch is derived.
    batch_size: int = 32
    steps: int = 100
    epochs: int = 1
    image_size: int = 224
    input_channels: int = 3
    num_classes: int = 1000
    data_dir: str = ""
    validation_steps: int = 0
    shuffle_buffer: int = 1024
    prefetch: int = 0
    cache: bool = False
    deterministic: bool = False
    stage_dir: str = ""
    skip_corrupt: bool = False
    record_sharding: bool = False
    # Preprocessing (image classification; flips also for segmentation).
    augment: str = "auto"
    horizontal_flip: str = "auto"
    eval_crop_fraction: float = 0.0
    normalization: str = "auto"
    # Evaluation and the training target.
    eval_every: int = 0
    eval_only: bool = False
    target_metric: str = ""
    # Optimisation.
    optimizer: str = "sgd"
    learning_rate: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 0.0
    lr_scaling: str = "none"
    grad_accum_steps: int = 1
    gradient_lag: int = 0
    warmup_steps: int = 0
    lr_schedule: str = "constant"
    lr_decay_steps: str = ""
    lr_decay_factor: float = 0.1
    lars_eta: float = 0.001
    larc_mode: str = "clip"
    lars_exclude_bias_bn: bool = True
    exclude_bias_bn_decay: bool = False
    class_weights: str = ""
    label_smoothing: float = 0.0
    # Compute.
    precision: str = "fp32"
    xla: str = "off"
    intra_op_threads: int = 0
    inter_op_threads: int = 0
    cpu_binding: bool = False
    tf32: bool = True
    cudnn_autotune: bool = True
    # Memory and batch-norm statistics.
    sync_bn: bool = False
    sync_bn_group: int = 0
    bn_statistics: str = "auto"
    bn_statistics_images: int = 1024
    recompute: bool = False
    # Distribution (each strategy's own options are in ``options``).
    collective_timeout_s: float = 0.0
    # Looking inside a step.
    profile_steps: str = ""
    # Output and reliability.
    model_dir: str = ""
    checkpoint_every: int = 0
    keep_checkpoints: int = 3
    log_every: int = 10
    seed: int = 0
    tensorboard: bool = True
    allow_config_change: bool = False
    # The chosen strategy's, model's and dataset's own options by name (see tfscale.config.options).
    options: Options = dataclasses.field(default_factory=Options)

    def __init__(self, options: Mapping[str, Any] | None = None, **values: Any) -> None:
        for field in dataclasses.fields(self):
            if field.name != "options":
                object.__setattr__(self, field.name, values.pop(field.name, field.default))
        # What is not a field is an option: the chosen plugins' own get their defaults.
        object.__setattr__(self, "options", plugin_options.resolve(
            self.plugins, {**(options or {}), **values}))
        validate(self)
        if not self.model_dir:
            object.__setattr__(self, "model_dir", self.default_model_dir)

    @property
    def plugins(self) -> dict[str, str]:
        """The plugins this config chooses, by the field that names them."""
        return {"strategy": self.strategy, "model": self.model, "dataset": self.dataset}

    @property
    def default_model_dir(self) -> str:
        """Where the run goes without ``--model_dir``: ``runs/MODEL-DATASET-STRATEGY``."""
        return f"runs/{self.model}-{self.dataset}-{self.strategy}"

    def replace(self, **changes: Any) -> TrainConfig:
        """A copy with ``changes`` (fields and options by name) applied (and validated)."""
        return TrainConfig(**{**self.to_dict(), **changes})

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON form, fields and options by name, as written into results.json (and
        turned back into flags for workers)."""
        values = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                  if field.name != "options"}
        return {**values, **self.options}

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def to_argv(self, **overrides: Any) -> list[str]:
        """The ``tfscale.train`` flags that reproduce this config (with ``overrides``), as a
        launcher passes them to its workers."""
        values = {**self.to_dict(), **overrides}
        return [f"--{k}={_flag_text(v)}" for k, v in sorted(values.items())]

    @property
    def profile_range(self) -> tuple[int, int] | None:
        """``profile_steps`` as (first, last) training step, 1-based and inclusive; None when
        not profiling.

        Raises:
            ValueError: naming the flag, for anything but ``A:B`` with 1 <= A <= B.
        """
        if not self.profile_steps:
            return None
        first, sep, last = self.profile_steps.partition(":")
        try:
            steps = (int(first), int(last if sep else first))
        except ValueError:
            steps = (0, 0)
        if not 1 <= steps[0] <= steps[1]:
            raise ValueError(f"--profile_steps={self.profile_steps!r}: expected A:B, the first "
                             "and last training step to trace, with 1 <= A <= B (e.g. 10:12)")
        return steps

    @property
    def decay_boundaries(self) -> tuple[int, ...]:
        """``lr_decay_steps`` parsed as step boundaries for the ``step`` schedule."""
        return _parse_ints(self.lr_decay_steps, "lr_decay_steps")


def _flag_text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def config_names() -> list[str]:
    """The names a config takes (its flags): the fields, then every registered strategy's
    options (plugins included)."""
    fields = [field.name for field in dataclasses.fields(TrainConfig) if field.name != "options"]
    return [*fields, *plugin_options.declared()]


def _parse_ints(text: str, name: str) -> tuple[int, ...]:
    if not text.strip():
        return ()
    try:
        return tuple(int(t) for t in text.split(","))
    except ValueError:
        raise ValueError(
            f"--{name}={text!r}: expected comma-separated integers, e.g. 1000,2000"
        ) from None


def _choice(cfg: TrainConfig, name: str, choices: tuple[str, ...]) -> None:
    value = getattr(cfg, name)
    if value not in choices:
        raise ValueError(f"--{name}={value!r} is not valid; choose one of: {', '.join(choices)}")


def _at_least(cfg: TrainConfig, name: str, low: float) -> None:
    value = getattr(cfg, name)
    if value < low:
        raise ValueError(f"--{name}={value} is not valid; expected a value >= {low}")


def validate(cfg: TrainConfig) -> None:
    """Checks every value that does not need a plugin registry.

    Raises:
        ValueError: naming the flag, the bad value and what is expected.
    """
    for name, choices in CHOICES.items():
        _choice(cfg, name, choices)
    for name in ("num_processes", "batch_size", "epochs", "image_size", "input_channels",
                 "keep_checkpoints", "log_every", "grad_accum_steps", "bn_statistics_images"):
        _at_least(cfg, name, 1)
    _at_least(cfg, "num_classes", 2)
    for name in ("steps", "validation_steps", "warmup_steps", "checkpoint_every",
                 "intra_op_threads", "inter_op_threads", "prefetch", "shuffle_buffer",
                 "weight_decay", "momentum", "collective_timeout_s", "label_smoothing",
                 "lars_eta", "eval_every", "sync_bn_group", "max_restarts"):
        _at_least(cfg, name, 0)
    if cfg.max_restarts and cfg.num_processes == 1:
        raise ValueError(f"--max_restarts={cfg.max_restarts} restarts the workers that "
                         "--num_processes starts; with --num_processes=1 nothing supervises this "
                         "process (rerun it, or give --num_processes > 1)")
    if not cfg.learning_rate > 0:
        raise ValueError(f"--learning_rate={cfg.learning_rate} is not valid; expected > 0")
    if cfg.steps == 0 and cfg.dataset == "synthetic":
        raise ValueError("--steps=0 (one pass over the data) needs a finite dataset, "
                         "not --dataset=synthetic; give --steps > 0")
    if cfg.steps and cfg.steps < cfg.epochs:
        raise ValueError(f"--steps={cfg.steps} is fewer than --epochs={cfg.epochs}; "
                         "each epoch needs at least one step")
    if cfg.warmup_steps and cfg.steps and cfg.warmup_steps > cfg.steps:
        raise ValueError(f"--warmup_steps={cfg.warmup_steps} exceeds --steps={cfg.steps}")
    if cfg.augment == "none" and cfg.horizontal_flip == "on":
        raise ValueError("--augment=none takes the whole image unchanged, so it cannot flip: "
                         "use --augment=flip for flips only, or drop --horizontal_flip=on")
    if not 0 <= cfg.eval_crop_fraction <= 1:
        raise ValueError(f"--eval_crop_fraction={cfg.eval_crop_fraction} is not valid; expected "
                         "a fraction of the shorter side in (0, 1], or 0 for the dataset's default")
    if cfg.label_smoothing >= 1:
        raise ValueError(f"--label_smoothing={cfg.label_smoothing} must be in [0, 1)")
    if cfg.gradient_lag not in (0, 1):
        raise ValueError(f"--gradient_lag={cfg.gradient_lag} is not valid; expected 0 (off) or 1 "
                         "(apply each step's averaged gradients one step later)")
    if cfg.gradient_lag and cfg.precision == "mixed_float16":
        raise ValueError("--gradient_lag does not combine with --precision=mixed_float16: a "
                         "lagged gradient would be unscaled with the next step's loss scale; "
                         "use fp32 or mixed_bfloat16")
    if cfg.sync_bn_group and not cfg.sync_bn:
        raise ValueError(f"--sync_bn_group={cfg.sync_bn_group} needs --sync_bn")
    if cfg.lr_schedule == "step" and not cfg.decay_boundaries:
        raise ValueError("--lr_schedule=step needs --lr_decay_steps, e.g. --lr_decay_steps=30,60")
    # The strategy's own flags and checks, which its class owns (the strategy registry adds
    # them: tfscale.strategies.registry.check_config).
    plugin_options.run_checks(cfg)
    for field in ("model", "dataset"):
        plugin_options.check_chosen(cfg.plugins, cfg.options, field)
    profile = cfg.profile_range
    if profile and cfg.steps > 0 and profile[1] > cfg.steps:
        raise ValueError(f"--profile_steps={cfg.profile_steps} ends after the run's last step "
                         f"(--steps={cfg.steps})")
    if cfg.target_metric:
        # Its form and direction here; its metric name, which depends on the model's task,
        # in tfscale.cli.plugins.validate_names. Imported here: targets imports this module.
        from tfscale.config.targets import parse_target

        parse_target(cfg.target_metric)
        if cfg.eval_only:
            raise ValueError("--target_metric does not apply to --eval_only (nothing is trained)")
