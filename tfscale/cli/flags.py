"""All absl flags of ``python -m tfscale.train``, and their conversion into a TrainConfig.

Flags mirror :class:`tfscale.config.train_config.TrainConfig` one to one: a flag is defined per
config field,
with the field's default and the help text below, and per option that a strategy declares in its
own file (:mod:`tfscale.config.options`), so the two cannot drift apart. Only the entry
point reads ``FLAGS``; it calls :func:`config_from_flags`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, cast

from absl import flags

from tfscale.cli import command
from tfscale.cluster import cpu_binding
from tfscale.config import options
from tfscale.config import train_config as cfg_mod
from tfscale.config.train_config import TrainConfig

HELP: dict[str, str] = {
    "model": "Model to train (see --list).",
    "dataset": "Input pipeline (see --list). Not given with --data_dir: the dataset that "
    "recognizes what the directory holds (a converter's manifest, TFRecord shards, class "
    "folders, HDF5 files), named at start-up; else synthetic.",
    "strategy": "Distribution strategy (see --list).",
    "num_processes": "Launch N local workers and wait for them; 1 runs in this process. Under "
    "horovodrun/mpirun/srun it must match the job's size.",
    "max_restarts": "With --num_processes > 1: when a worker fails, stop all of them and start "
    "the group again (resuming from the last checkpoint) up to N times. A worker that exits 2 "
    "(bad usage) or 75 (preempted), or a signalled launcher, ends the job instead.",
    "batch_size": "Batch size per replica (per micro-batch with --grad_accum_steps); the global "
    "batch is batch_size x replicas x grad_accum_steps.",
    "steps": "Total optimizer steps (0 = epochs x one pass over a finite dataset). Not given: "
    "0 with --data_dir (--epochs passes over the files), else 100.",
    "epochs": "Number of epochs the steps are divided into (logs, metrics, checkpoints).",
    "image_size": "Height and width of input images. Not given with a --data_dir of images: "
    "their mean shorter side as the converter's manifest.json or the class folders record it, "
    "at most 224 (see docs/INPUT_PIPELINES.md).",
    "input_channels": "Channels of the input (3 for RGB, 16 for climate data). Not given with a "
    "--data_dir of images: 1 when every image is grey, else 3.",
    "num_classes": "Number of classes. Not given with a --data_dir of images: the number of "
    "classes the data records.",
    "data_dir": "Directory or glob of the dataset's files.",
    "validation_steps": "Evaluate on at most N validation batches per worker (needed for "
    "synthetic data); 0 = the whole validation split when --data_dir has one, else no "
    "evaluation.",
    "shuffle_buffer": "Records in the shuffle buffer (0 = no record shuffling).",
    "prefetch": "Batches to prefetch (0 = AUTOTUNE).",
    "cache": "Cache decoded records in memory after the first epoch.",
    "deterministic": "Reproducible runs: fixed op order and data order, exact resume.",
    "stage_dir": "Copy this worker's shards to this node-local directory before training.",
    "skip_corrupt": "Skip corrupt files/records (and report how many) instead of failing.",
    "record_sharding": "Shard by record instead of by file (when there are fewer files than "
    "workers).",
    "augment": "Training augmentation of image classification data. imagenet: random-resized "
    "crop (8-100% of the area) + flip; small: the whole image resized, padded by 1/8 of the side "
    "and randomly cropped back + flip (the CIFAR recipe); flip: the whole image resized + flip; "
    "none: the whole image resized, nothing else. auto: imagenet for --image_size >= 128, else "
    "none (flip with --horizontal_flip=on): on small images every shift tried slowed the time to "
    "accuracy of a 10-epoch run on two real datasets (docs/ACCURACY.md); small is for long runs "
    "on natural images.",
    "horizontal_flip": "Random left-right flips in training (augment modes imagenet, small, "
    "flip). auto: on for those modes; --augment=auto on images < 128 px resolves to none, which "
    "never flips (a mirror changes a digit or a letter).",
    "eval_crop_fraction": "Evaluation central crop as a fraction of the shorter side (0.875 = "
    "224 of 256); 0 = auto: 0.875 for --image_size >= 128, else 1.0 (the whole image).",
    "normalization": "Pixel normalization. imagenet: ImageNet mean/std; dataset: the training "
    "data's per-channel mean/std from the converter's manifest.json or, for image folders, the "
    "stats.json of python -m input_pipelines.tools.stats; none: pixels / 255. auto: dataset when "
    "those statistics exist, else imagenet.",
    "eval_every": "Also evaluate on the whole validation split every N steps (0 = at the end of "
    "each epoch only).",
    "eval_only": "Evaluate the newest checkpoint in --model_dir on the validation split, without "
    "training.",
    "target_metric": "Stop when a reported metric reaches a value: NAME:VALUE[:min|max], e.g. "
    "val_accuracy:0.95 (direction: min for losses, max otherwise).",
    "optimizer": "Optimizer: sgd or nesterov (Keras' SGD with momentum, its update fused into "
    "one pass over each variable: the same weights, about half the update's time), adamw, "
    "lamb, lars or larc (docs/LARGE_BATCH.md).",
    "learning_rate": "Base learning rate (for the reference batch before --lr_scaling).",
    "momentum": "Momentum (SGD/Nesterov/LARS/LARC) or beta_1 (AdamW/LAMB).",
    "weight_decay": "Weight decay.",
    "lr_scaling": "linear: multiply the learning rate by global batch / batch_size = replicas x "
    "grad_accum_steps (Goyal et al.).",
    "grad_accum_steps": "Gradient accumulation: each optimizer step averages the gradients of K "
    "micro-batches of batch_size per replica, run one after the other, and exchanges them once "
    "(all strategies). --steps, warmup, schedules and checkpoints count optimizer steps; images/s "
    "counts examples. See docs/LARGE_BATCH.md.",
    "gradient_lag": "1: gradient lag (Kurth et al., SC18): step t applies the averaged gradients "
    "of step t-1, so their all-reduce overlaps step t's forward and backward pass; the first "
    "step applies nothing. 0: off. Horovod strategies only. See docs/LARGE_BATCH.md.",
    "warmup_steps": "Linear learning-rate warmup steps from 0 to the scaled rate.",
    "lr_schedule": "Decay after warmup.",
    "lr_decay_steps": "Comma-separated step boundaries for --lr_schedule=step.",
    "lr_decay_factor": "Multiplier at each boundary of --lr_schedule=step.",
    "lars_eta": "LARS/LARC trust coefficient.",
    "larc_mode": "LARC: clip the local rate at the global one, or scale by the trust ratio.",
    "lars_exclude_bias_bn": "Exclude biases and batch-norm parameters from LARS/LARC adaptation "
    "and weight decay.",
    "exclude_bias_bn_decay": "No weight decay on biases and batch-norm scales and offsets "
    "(variables of rank <= 1), for every optimizer (Goyal et al. 2017); LARS and LARC leave them "
    "out with --lars_exclude_bias_bn already. Off by default: docs/STATISTICAL_SCALING.md has "
    "what it changed here.",
    "class_weights": "Per-class loss weights: comma-separated numbers or a JSON file written by "
    "python -m input_pipelines.tools.class_weights.",
    "label_smoothing": "Label smoothing for classification.",
    "precision": "Compute precision (mixed = float16/bfloat16 compute, float32 variables). auto: "
    "bfloat16 where the device computes it natively (CPUs with AVX512_BF16/AMX or Arm BF16, GPUs "
    "from compute capability 8.0), float16 on GPUs from 7.0, else fp32. An explicit mixed "
    "precision that the hardware only emulates (e.g. bfloat16 on an AVX2-only CPU: ~10x slower) "
    "warns.",
    "xla": "off; jit = compile the training step (the model's forward and backward passes only "
    "where the gradient exchange cannot run in XLA: horovod, ddl, and mirrored/multiworker "
    "replicas on CPUs); auto = TF auto-clustering.",
    "intra_op_threads": "TF intra-op threads (0 = one per bound core with --cpu_binding, else "
    "TF's choice). Setting it leaves --cpu_binding as it is; each worker logs its cores and "
    "thread counts.",
    "inter_op_threads": "TF inter-op threads (0 = TF's choice).",
    "cpu_binding": "Bind each local worker to its own share of the cores (and size its thread "
    "pools to them). Not given: on when --num_processes > 1 starts several workers here (they "
    "would otherwise each run a thread per core of the machine) and there are at least as many "
    "cores as workers, else off.",
    "tf32": "GPUs: allow TensorFloat-32 in float32 matmuls and convolutions (Ampere and newer).",
    "cudnn_autotune": "GPUs: let cuDNN time its convolution algorithms and keep the fastest.",
    "sync_bn": "Synchronized batch normalization: in training, batch-norm statistics are computed "
    "over the batches of all replicas (or of groups of --sync_bn_group replicas), not each "
    "replica's own. All strategies; inference and the saved model use ordinary batch norm.",
    "sync_bn_group": "With --sync_bn: replicas per statistics group (consecutive ranks; must "
    "divide the number of replicas). 0 = all replicas.",
    "bn_statistics": "Batch-norm statistics that evaluation, checkpoints and the saved model "
    "use. precise: before each evaluation and at the end of training, every batch-norm layer's "
    "mean and variance are recomputed with the weights fixed over --bn_statistics_images "
    "training images, shared out over the workers and summed with one all-reduce (Wu & Johnson "
    "2021): right after any number of steps, and the same on every worker. It costs a forward "
    "pass over those images each time, about a third of the time training on them takes, "
    "logged at each recomputation (1024 images: 0.5-1 s for resnet50_tiny at 32 px on a 2-core "
    "CPU, over a minute for ResNet-50 at 224 px there, about a second on a GPU; "
    "docs/STATISTICAL_SCALING.md). ema: Keras' moving "
    "averages (momentum 0.99: after S steps 0.99^S of the initial statistics remain, 17% after "
    "176 steps), pooled over the workers before each evaluation and at the end. auto: precise "
    "on data read from --data_dir, ema on generated data (nothing to evaluate).",
    "bn_statistics_images": "With precise batch-norm statistics: training images they are "
    "recomputed over, all workers together (rounded up to whole batches of every replica).",
    "recompute": "Activation recomputation: keep only each block's inputs (ResNet bottlenecks, "
    "DeepLabV3+ blocks, Tiramisu dense blocks) in the forward pass and recompute the rest in the "
    "backward pass: less memory for more compute. See docs/LARGE_BATCH.md.",
    "collective_timeout_s": "Collective timeout in seconds; a dead peer raises instead of hanging, "
    "and a worker none of whose steps ends for this long (a peer or its link lost mid-"
    "collective) exits with code 4 (0 = library default, no watchdog).",
    "profile_steps": "A:B traces training steps A to B (1-based, inclusive) with TensorFlow's "
    "profiler on the chief, into MODEL_DIR/tensorboard (TensorBoard's profile tab). Empty: off.",
    "model_dir": "Where checkpoints, logs, results.json and model.keras go (default "
    "runs/MODEL-DATASET-STRATEGY). An existing checkpoint there is resumed.",
    "checkpoint_every": "Checkpoint every N steps (0 = at the end of each epoch).",
    "keep_checkpoints": "Number of checkpoints to keep.",
    "log_every": "Print progress every N steps (chief only).",
    "seed": "Random seed.",
    "tensorboard": "Write TensorBoard logs (chief only).",
    "allow_config_change": "Resume a run in --model_dir although flags that change what is "
    "trained differ from those it was started with (each difference is logged); without it "
    "such a resume stops, listing them. Length, logging, checkpointing, the number of workers "
    "and performance flags may always change.",
}

# Old flag names that still work: alias -> flag.
ALIASES = {"ddl_node_exchange": "node_exchange"}

FIELDS = [f for f in dataclasses.fields(TrainConfig) if f.name != "options"]


def define_flags(flag_values: flags.FlagValues = flags.FLAGS) -> None:
    """Defines one absl flag per TrainConfig field, and one per option that a registered
    strategy, model or dataset declares (in ``--helpfull``, a group per set of plugins that read
    it), on ``flag_values`` (idempotent)."""
    # The registries, whose plugins declare the options (no TensorFlow: declared by name).
    from tfscale.cli import plugins as _registries  # noqa: F401

    if "model" in flag_values:
        return
    fv = flag_values
    flags.DEFINE_bool("list", False, "List the registered models, datasets and strategies.",
                      flag_values=fv)
    for field in FIELDS:
        name, default = field.name, cast(Any, field.default)
        helptext = HELP[name]
        if name in cfg_mod.CHOICES:
            helptext = f"{helptext} One of: {', '.join(cfg_mod.CHOICES[name])}."
            flags.DEFINE_string(name, default, helptext, flag_values=fv)
        elif isinstance(default, bool):
            flags.DEFINE_bool(name, default, helptext, flag_values=fv)
        elif isinstance(default, int):
            flags.DEFINE_integer(name, default, helptext, flag_values=fv)
        elif isinstance(default, float):
            flags.DEFINE_float(name, default, helptext, flag_values=fv)
        else:
            flags.DEFINE_string(name, default, helptext, flag_values=fv)
    for option in options.declared().values():
        owners = options.readers(option.name).items()
        option.define(fv, "options of " + ", ".join(
            f"--{field}={'|'.join(sorted(plugins))}" for field, plugins in owners))
    for alias, name in ALIASES.items():
        flags.DEFINE_alias(alias, name, flag_values=fv)


def config_from_flags(values: flags.FlagValues,
                      choose_dataset: Callable[[str, str], str] | None = None,
                      from_data: Callable[[TrainConfig, frozenset[str]], TrainConfig] | None = None,
                      ) -> TrainConfig:
    """Builds the validated config from parsed flags.

    Args:
        values: the parsed flags.
        choose_dataset: ``(data_dir, model) -> dataset name``, asked when ``--data_dir`` is
            given without ``--dataset`` (the entry points pass
            :func:`tfscale.cli.plugins.choose_dataset`, which recognizes what the directory holds).
        from_data: ``(config, names of the flags given) -> config``, asked when ``--data_dir``
            is given: fills in what the data records (the entry points pass
            :func:`input_pipelines.shapes_from_data`: image size, classes, channels).

    Raises:
        ValueError: for any invalid value (see :func:`tfscale.config.train_config.validate`).
    """
    kwargs: dict[str, Any] = {name: values[name].value for name in cfg_mod.config_names()}
    if kwargs["eval_only"]:
        kwargs.update(_as_trained(kwargs, {name for name in kwargs if values[name].present}))
    if kwargs["data_dir"] and not values["dataset"].present and choose_dataset is not None:
        kwargs["dataset"] = choose_dataset(kwargs["data_dir"], kwargs["model"])
    if kwargs["data_dir"] and not values["steps"].present:
        # Files are finite: a run on them without --steps is --epochs passes over them, not
        # --steps' default of 100 steps cut into epochs of a fraction of the data.
        kwargs["steps"] = 0
    if not values["cpu_binding"].present:
        kwargs["cpu_binding"] = cpu_binding.binds_by_default(kwargs["num_processes"])
    config = TrainConfig(**kwargs)
    if from_data is not None and config.data_dir:
        config = from_data(config, frozenset(name for name in kwargs if values[name].present))
    return config


def _as_trained(kwargs: dict[str, Any], given: set[str]) -> dict[str, Any]:
    """``--eval_only``: what the evaluated run trained with (its model, data, preprocessing
    and optimizer, from its model_dir's config.json) for every such flag not given."""
    from tfscale.cluster import rank_zero
    from tfscale.training import resume as config_change

    model_dir = kwargs["model_dir"] or TrainConfig(**kwargs).model_dir
    saved = config_change.saved_config(model_dir)
    if saved is None:
        return {}
    trained = {"batch_size", "grad_accum_steps"} | (set(kwargs) - config_change.may_change())
    taken = {name: saved[name] for name in sorted(trained - given)
             if name in saved and saved[name] != kwargs[name]}
    if taken:
        shown = ", ".join(f"--{name}={value}" for name, value in taken.items())
        rank_zero.log(f"--eval_only: as {model_dir} was trained (its config.json): {shown}")
    return taken


def config_from_args(train_args: tuple[str, ...]) -> TrainConfig:
    """Parses and validates the ``tfscale.train`` flags the job will run with, the model,
    dataset and strategy names included, as ``tfscale.train`` does (without TensorFlow).

    Raises:
        ValueError: for an unknown flag, a positional argument, an invalid value or an
            unknown name (listing the registered ones).
    """
    # The registries first: their plugins declare flags (a dataset's, a model's).
    from tfscale.cli import plugins

    values = flags.FlagValues()
    define_flags(values)
    try:
        rest = values(["tfscale.train", *train_args])
    except flags.Error as err:
        raise ValueError(f"tfscale.train flags: {command.flag_error(err)}") from None
    if len(rest) > 1:
        raise ValueError(f"tfscale.train takes only --flags; got {rest[1:]}")
    config = config_from_flags(values, plugins.choose_dataset)
    plugins.check_names(config)
    return config
