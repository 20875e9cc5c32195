"""Resuming with a changed command: the configuration saved in a model_dir against the new one.

A run in a model_dir that holds a checkpoint resumes it, so a changed learning rate, optimizer or
batch size would otherwise continue someone else's training without a word. The chief saves the
configuration a run trains with in ``MODEL_DIR/config.json``; before the next attempt resumes,
:func:`check_resume` compares the two. Fields in :data:`MAY_CHANGE` (and the strategies' own
tuning flags) may differ between attempts; any other difference stops the run, listing the
fields, unless ``--allow_config_change``, which logs each one.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tfscale.config.options import declared
from tfscale.config.train_config import TrainConfig
from tfscale.training.checkpointing import CheckpointManager
from tfscale.training.files import write_json_atomic

SAVED = "config.json"
RESULTS = "results.json"  # runs from before config.json kept their config only there

# How long the run is, how it is logged, checkpointed, evaluated and staged, where and on how
# many workers it runs (resuming on another world size and strategy is supported), and compute
# settings that leave what is trained alone. The batch per replica and the micro-batches may
# change with the workers: what is trained is the global batch, which the trainer checks
# against the checkpoint's (tfscale.training.trainer.Trainer._resume_global_batch).
MAY_CHANGE = frozenset({
    "batch_size", "grad_accum_steps",
    "num_processes", "max_restarts", "strategy", "collective_timeout_s", "steps", "epochs",
    "validation_steps", "eval_every", "eval_only", "bn_statistics", "bn_statistics_images",
    "target_metric", "prefetch", "cache", "stage_dir", "skip_corrupt", "intra_op_threads",
    "inter_op_threads", "cpu_binding", "xla", "tf32", "cudnn_autotune", "recompute",
    "profile_steps", "model_dir", "checkpoint_every",
    "keep_checkpoints", "log_every", "tensorboard", "allow_config_change",
})


def may_change() -> frozenset[str]:
    """:data:`MAY_CHANGE` and every registered strategy's options that leave what is trained
    alone (``Option.changes_training`` False)."""
    return MAY_CHANGE.union(option.name for option in declared().values()
                            if not option.changes_training)


def saved_config(model_dir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The configuration saved in ``model_dir`` (its config.json, else its results.json's),
    or None when it holds none."""
    for name, key in ((SAVED, None), (RESULTS, "config")):
        try:
            document = json.loads((Path(model_dir) / name).read_text())
        except (OSError, ValueError):
            continue
        found = document.get(key) if key and isinstance(document, dict) else document
        if isinstance(found, dict):
            return found
    return None


def differences(saved: Mapping[str, Any], config: TrainConfig) -> dict[str, tuple[Any, Any]]:
    """The fields outside :func:`may_change` whose value in ``config`` differs from ``saved``:
    name -> (saved value, new value). Fields one side lacks (another tfscale version) are
    left out."""
    new = config.to_dict()
    allowed = may_change()
    return {name: (saved[name], value) for name, value in new.items()
            if name in saved and name not in allowed and saved[name] != value}


def resumed_config(config: TrainConfig) -> dict[str, Any] | None:
    """The configuration saved with the checkpoint that ``config`` would resume (or evaluate):
    None when its model_dir holds no checkpoint, or no saved configuration."""
    if not CheckpointManager(Path(config.model_dir) / "checkpoints").steps():
        return None
    return saved_config(config.model_dir)


def check_resume(config: TrainConfig, log: Callable[[str], object]) -> None:
    """Stops a training run that would resume ``config.model_dir``'s checkpoint with another
    configuration than the one saved there; with ``--allow_config_change``, logs each change.

    Raises:
        ValueError: listing the differing fields (saved -> new) and the ways out.
    """
    if config.eval_only:
        return
    saved = resumed_config(config)
    changed = differences(saved, config) if saved is not None else {}
    if not changed:
        return
    listed = ", ".join(f"--{name} {old!r} -> {new!r}" for name, (old, new) in changed.items())
    if config.allow_config_change:
        for name, (old, new) in changed.items():
            log(f"--allow_config_change: resuming {config.model_dir} with --{name} changed "
                f"from {old!r} to {new!r}")
        return
    where = (f"--model_dir was not given, and its default {config.model_dir}"
             if config.model_dir == config.default_model_dir else f"--model_dir={config.model_dir}")
    raise ValueError(f"{where} holds a checkpoint trained with another configuration "
                     f"({listed}); resume it with its own flags, give another --model_dir for a "
                     "new run, or add --allow_config_change to resume with these changes")


def save(config: TrainConfig) -> None:
    """Saves ``config`` as the configuration of ``config.model_dir`` (chief only)."""
    write_json_atomic(Path(config.model_dir) / SAVED, config.to_dict())
