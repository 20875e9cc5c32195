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

Your own pipeline registers with the decorator ``@input_pipelines.register(name, description,
task=...)``. The built-in ones are declared at the end of this module by name, builder
(``"module:function"``), description and task (:mod:`tfscale.tasks`); a dataset's module is
imported when its builder is fetched.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING

from tfscale.registry import TaskRegistry
from tfscale.shard import Shard  # re-exported: pipelines take it, strategies make it
from tfscale.tasks import CLASSIFICATION, SEGMENTATION

if TYPE_CHECKING:
    import tensorflow as tf

    from tfscale.config import TrainConfig


@dataclasses.dataclass(frozen=True)
class Batches:
    """A worker's batched dataset and how many examples it sees per epoch."""

    dataset: tf.data.Dataset
    examples: int | None


PipelineBuilder = Callable[["TrainConfig", Shard, str, int], Batches]

# Built-in pipelines are declared, not imported: their modules import TensorFlow, which listing
# the datasets or checking a name (and a tool that only parses flags) does not need.
PIPELINES: TaskRegistry[PipelineBuilder] = TaskRegistry("dataset",
                                                        entry_point_group="tfscale.datasets")
SPLITS = ("train", "validation")


# Registering checks the task (classification|segmentation); task_of reads it without importing.
register = PIPELINES.register_for
declare = PIPELINES.declare_for
task_of = PIPELINES.task_of


# One module per dataset under input_pipelines/datasets/, each with a ``build`` function.
declare("image_folder", "input_pipelines.datasets.image_folder:build",
        "classification from folders of images, one sub-folder per class", CLASSIFICATION)
declare("imagenet", "input_pipelines.datasets.imagenet:build",
        "ImageNet-style JPEG classification from TFRecord shards "
        "(image/encoded, image/class/label)", CLASSIFICATION)
declare("lmdb", "input_pipelines.datasets.lmdb:build",
        "classification from LMDB environments of Caffe Datum records (encoded or raw "
        "images), e.g. convert_imageset's or folder_to_lmdb's", CLASSIFICATION)
declare("segmentation_h5", "input_pipelines.datasets.segmentation_h5:build",
        "segmentation from HDF5 files (data HxWxC float, labels HxW int), "
        "normalized with stats.json", SEGMENTATION)
declare("segmentation_tfrecord", "input_pipelines.datasets.segmentation_tfrecord:build",
        "segmentation from TFRecord shards (raw float data, int labels), "
        "normalized with stats.json", SEGMENTATION)
declare("synthetic", "input_pipelines.datasets.synthetic:build",
        "random images and labels generated once on the device", CLASSIFICATION)
declare("synthetic_seg", "input_pipelines.datasets.synthetic_seg:build",
        "climate-like multi-channel fields with rare small objects (generated on the fly)",
        SEGMENTATION)
