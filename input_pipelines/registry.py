"""Registry of input pipelines and the contract every pipeline follows.

A pipeline builder is called once per worker process as
``builder(config, shard, split, batch_size) -> Batches``:

- ``shard`` says which part of the data this process reads (file-level sharding by
  ``shard.index`` of ``shard.count``; record-level with ``config.record_sharding``), and where
  the process sits on its node (``local_index`` of ``local_count``, for node-local staging).
- ``split`` is ``"train"`` or ``"validation"``.
- ``batch_size`` is this process's batch (per-replica batch x replicas in this process).
- Batches are ``(images float32 [B,H,W,C], labels int32 [B])`` for classification and
  ``(images float32 [B,H,W,C], labels int32 [B,H,W])`` for segmentation.
- The ``"train"`` dataset repeats forever (the trainer counts steps), with
  ``drop_remainder=True`` so shapes are static.
- The ``"validation"`` dataset of a finite split is ONE pass over this shard's examples in a
  fixed order, each exactly once, the last batch partial (no ``drop_remainder``); it is empty
  for a shard without validation examples (every worker still takes part in the evaluation's
  all-reduce). Evaluation (:mod:`tfscale.evaluation`) reads it whole, or at most
  ``--validation_steps`` batches when that is > 0. Unbounded validation data (``synthetic``)
  may repeat, with ``examples=None``; it is evaluated only with ``--validation_steps``.
- ``Batches.examples`` is the number of examples of the split this shard sees per epoch (per
  pass, for validation), or ``None`` when unbounded (synthetic data).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from tfscale.registry import Registry
from tfscale.shard import Shard  # re-exported: pipelines take it, strategies make it

if TYPE_CHECKING:
    import tensorflow as tf

    from tfscale.config import TrainConfig


@dataclasses.dataclass(frozen=True)
class Batches:
    """A worker's batched dataset and how many examples it sees per epoch."""

    dataset: tf.data.Dataset
    examples: int | None


PipelineBuilder = Callable[["TrainConfig", Shard, str, int], Batches]
BUILTIN = ("image_folder", "imagenet", "segmentation_h5", "segmentation_tfrecord", "synthetic",
           "synthetic_seg")


def _load_builtin() -> None:
    for module in BUILTIN:
        importlib.import_module(f"input_pipelines.datasets.{module}")


# The built-in pipelines are imported on the first lookup, not with the package: they import
# TensorFlow, which a tool or a command that only parses flags does not need.
PIPELINES: Registry[PipelineBuilder] = Registry("dataset", _load_builtin)
SPLITS = ("train", "validation")


def register(
    name: str, description: str, task: str
) -> Callable[[PipelineBuilder], PipelineBuilder]:
    """Registers a pipeline builder under ``name`` for ``task`` (classification|segmentation)."""
    return PIPELINES.register(name, description, task=task)


def task_of(name: str) -> str:
    """The task (classification|segmentation) of registered dataset ``name``."""
    return str(PIPELINES.entry(name).meta["task"])
