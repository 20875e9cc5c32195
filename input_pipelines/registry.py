"""Registry of input pipelines and the contract every pipeline follows.

A pipeline builder is called once per worker process as
``builder(settings, shard, split, batch_size) -> Batches``, where ``settings`` is the
dataset's :class:`~tfscale.config.settings.DataSettings` (where the data is, how it is read and
preprocessed, its shapes and the dataset's own options; not the rest of the run's
configuration: ``PIPELINES.get(name)`` returns the builder taking the run's ``TrainConfig`` and
handing it ``DataSettings.of(config, name)``):

- ``shard`` says which part of the data this process reads (file-level sharding by
  ``shard.index`` of ``shard.count``; record-level with ``settings.record_sharding``), and where
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
  all-reduce). Evaluation (:mod:`tfscale.training.evaluation`) reads it whole, or at most
  ``--validation_steps`` batches when that is > 0. Unbounded validation data (``synthetic``)
  may repeat, with ``examples=None``; it is evaluated only with ``--validation_steps``.
- ``Batches.examples`` is the number of examples of the split this shard sees per epoch (per
  pass, for validation), or ``None`` when unbounded (synthetic data).

Your own pipeline registers with the decorator ``@input_pipelines.register(name, description,
task=...)``, optionally with ``recognize=`` (a function, or ``"module:function"``, taking the
``--data_dir`` and returning a few words on what it found there, or None when that is not this
dataset's data: how the dataset is chosen when ``--dataset`` is left out, see :func:`recognize`),
``reads_data_dir=False`` for data generated without files (a ``--data_dir`` is then an
error), ``shape=`` (a function, or ``"module:function"``, taking the ``--data_dir`` and
returning the classes and image sizes its files record, or None: where the defaults of
``--num_classes``, ``--image_size`` and ``--input_channels`` come from, see
:mod:`input_pipelines.core.data_shape`), ``options=`` (its own flags:
:class:`tfscale.config.options.Option` declarations, or ``"module:attribute"`` naming them; refused
with another ``--dataset``), ``inference=`` (a function, or ``"module:function"``, taking
the dataset's ``DataSettings`` and returning an
:class:`input_pipelines.core.inference.Inference`: how evaluation turns a raw image into the
model's input, which the trainer puts in front of the exported model), and, for data read
from files, the two rules of its layout (each by default that of
:mod:`input_pipelines.core.files`: ``SPLIT-*`` files or a ``SPLIT/`` folder): ``files=`` (a
function, or ``"module:function"``, taking the ``--data_dir`` and a split and returning the
files its builder reads for that split, or raising a
:class:`~input_pipelines.core.errors.DataError` that names what is missing: what ``io_check``
times, see :func:`dataset_files`) and ``has_validation=`` (a function, or
``"module:function"``, taking the ``--data_dir`` and returning whether it holds a validation
split: whether a run evaluates, see :func:`has_validation_split`). The built-in ones are
declared at the end of this module by name, builder (``"module:function"``), description and
task (:mod:`tfscale.config.tasks`); a dataset's module is imported when its builder is fetched.
"""

from __future__ import annotations

import dataclasses
import importlib
import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from input_pipelines.core import files as layout
from tfscale.cluster.shard import Shard as Shard  # re-exported: pipelines take it
from tfscale.config import options
from tfscale.config.registry import TaskRegistry
from tfscale.config.settings import DataSettings, hand
from tfscale.config.tasks import CLASSIFICATION, SEGMENTATION

if TYPE_CHECKING:
    import tensorflow as tf

    from input_pipelines.core.inference import Inference
    from tfscale.config.train_config import TrainConfig



@dataclasses.dataclass(frozen=True)
class Batches:
    """A worker's batched dataset and how many examples it sees per epoch."""

    dataset: tf.data.Dataset
    examples: int | None


# Registered: (DataSettings, Shard, split, batch) -> Batches; PIPELINES.get returns it taking
# the run's TrainConfig or settings first.
PipelineBuilder = Callable[..., Batches]
# data_dir -> what this dataset's recognizer found there, or None.
Recognizer = Callable[[str], "str | None"]

# Built-in pipelines are declared, not imported: their modules import TensorFlow, which listing
# the datasets or checking a name (and a tool that only parses flags) does not need.
PIPELINES: TaskRegistry[PipelineBuilder] = TaskRegistry(
    "dataset", entry_point_group="tfscale.datasets", hand=hand(DataSettings))
SPLITS = ("train", "validation")
# Each dataset's options (options=), for the flags and configs.
options.add_source("dataset", lambda: (
    (entry.name, options.from_meta(entry.meta.get("options", ()))) for entry in PIPELINES))


# Registering checks the task (classification|segmentation); task_of reads it without importing.
register = PIPELINES.register_for
declare = PIPELINES.declare_for
task_of = PIPELINES.task_of


def reads_data_dir(name: str) -> bool:
    """Whether dataset ``name`` reads ``--data_dir`` (``reads_data_dir=False`` datasets generate
    their data)."""
    return bool(PIPELINES.entry(name).meta.get("reads_data_dir", True))


def hook(name: str, key: str) -> Callable[..., Any] | None:
    """The function that dataset ``name``'s entry names under ``key`` (``recognize``,
    ``shape``, ``inference``, ``files``, ``has_validation``), imported when given as
    ``"module:function"``; None if none."""
    found = PIPELINES.entry(name).meta.get(key)
    if isinstance(found, str):
        module, _, attribute = found.partition(":")
        found = getattr(importlib.import_module(module), attribute)
    return found


def inference_for(config: TrainConfig) -> Inference | None:
    """The inference preprocessing ``config.dataset`` declares (``inference=``, made from the
    dataset's settings), or None when it declares none."""
    make = hook(config.dataset, "inference")
    if make is None:
        return None
    inference: Inference = make(DataSettings.of(config))
    return inference


def dataset_files(name: str, data_dir: str, split: str) -> list[str]:
    """The files dataset ``name`` reads for ``split`` under ``data_dir``, by its ``files=``
    rule (by default :func:`input_pipelines.core.files.split_files`: ``SPLIT-*`` files or a
    ``SPLIT/`` folder).

    Raises:
        UnknownNameError: for an unknown dataset, listing the registered ones.
        ValueError: for a dataset that reads no files, or (DataError) a ``data_dir`` without
            the split's files, naming what is missing.
    """
    if not reads_data_dir(name):
        raise ValueError(f"--dataset={name} generates its data and reads no files")
    rule = hook(name, "files") or layout.split_files
    return list(rule(data_dir, split))


def has_validation_split(data_dir: str, dataset: str | None = None) -> bool:
    """Whether ``data_dir`` holds a validation split of ``dataset``, by its ``has_validation=``
    rule (by default :func:`input_pipelines.core.files.has_validation_files`: ``validation-*``
    files or a ``validation/`` folder); a run evaluates on it when it does. Without
    ``dataset``, for a caller that does not know it: whether the rule of any dataset that reads
    files finds one.

    Raises:
        UnknownNameError: for an unknown dataset, listing the registered ones.
    """
    if not data_dir:
        return False
    names = [dataset] if dataset is not None else [entry.name for entry in PIPELINES]
    for name in names:
        if not reads_data_dir(name):
            continue
        rule = hook(name, "has_validation") or layout.has_validation_files
        if rule(data_dir):
            return True
    return False


def recognize(data_dir: str, task: str) -> tuple[str, str]:
    """Chooses the dataset of ``task`` for ``data_dir`` by asking each dataset's recognizer.

    Returns:
        The dataset's name and what its recognizer found in ``data_dir``.

    Raises:
        ValueError: ``data_dir`` does not exist, or no dataset, or more than one, recognizes
            it (naming the candidates and the datasets to choose from with ``--dataset``).
    """
    if not (os.path.exists(data_dir) or layout.is_glob(data_dir)):
        raise ValueError(f"--data_dir={data_dir} does not exist")
    entries = [e for e in PIPELINES if e.meta["task"] == task and reads_data_dir(e.name)]
    found: dict[str, str] = {}
    for entry in entries:
        recognizer = hook(entry.name, "recognize")
        what = recognizer(data_dir) if recognizer is not None else None
        if what:
            found[entry.name] = what
    choices = ", ".join(e.name for e in entries)
    if not found:
        raise ValueError(f"--data_dir={data_dir}: no {task} dataset recognizes what it holds; "
                         f"give --dataset, one of: {choices}")
    if len(found) > 1:
        seen = "; ".join(f"{name}: {what}" for name, what in sorted(found.items()))
        raise ValueError(f"--data_dir={data_dir} could be read by several datasets ({seen}); "
                         f"give --dataset, one of: {', '.join(sorted(found))}")
    return next(iter(found.items()))


# One module per dataset under input_pipelines/datasets/, each with a ``build`` function.
SHAPES = "input_pipelines.core.data_shape"
FOLDERS = "input_pipelines.core.class_folders"
LMDB = "input_pipelines.core.lmdb_env"
declare("image_folder", "input_pipelines.datasets.image_folder:build",
        "classification from folders of images, one sub-folder per class", CLASSIFICATION,
        recognize="input_pipelines.core.recognize:image_folder",
        shape=f"{SHAPES}:from_class_folders", options=f"{SHAPES}:OPTIONS",
        inference="input_pipelines.core.inference:image_folders",
        files=f"{FOLDERS}:image_files", has_validation=f"{FOLDERS}:has_validation")
declare("imagenet", "input_pipelines.datasets.imagenet:build",
        "ImageNet-style JPEG classification from TFRecord shards "
        "(image/encoded, image/class/label)", CLASSIFICATION,
        recognize="input_pipelines.core.recognize:imagenet",
        shape=f"{SHAPES}:from_manifest", options=f"{SHAPES}:OPTIONS",
        inference="input_pipelines.core.inference:images")
declare("lmdb", "input_pipelines.datasets.lmdb:build",
        "classification from LMDB environments of Caffe Datum records (encoded or raw "
        "images), e.g. convert_imageset's or folder_to_lmdb's", CLASSIFICATION,
        recognize=f"{LMDB}:recognize",
        shape=f"{SHAPES}:from_manifest", options=f"{SHAPES}:OPTIONS",
        inference="input_pipelines.core.inference:images",
        files=f"{LMDB}:data_files", has_validation=f"{LMDB}:has_validation")
declare("segmentation_h5", "input_pipelines.datasets.segmentation_h5:build",
        "segmentation from HDF5 files (data HxWxC float, labels HxW int), "
        "normalized with stats.json", SEGMENTATION,
        recognize="input_pipelines.core.recognize:segmentation_h5",
        inference="input_pipelines.core.inference:samples",
        files="input_pipelines.core.sample_files:h5_files")
declare("segmentation_tfrecord", "input_pipelines.datasets.segmentation_tfrecord:build",
        "segmentation from TFRecord shards (raw float data, int labels), "
        "normalized with stats.json", SEGMENTATION,
        recognize="input_pipelines.core.recognize:segmentation_tfrecord",
        inference="input_pipelines.core.inference:samples")
declare("synthetic", "input_pipelines.datasets.synthetic:build",
        "random images and labels generated once on the device", CLASSIFICATION,
        reads_data_dir=False, options="input_pipelines.datasets.synthetic:OPTIONS")
declare("synthetic_seg", "input_pipelines.datasets.synthetic_seg:build",
        "climate-like multi-channel fields with rare small objects (generated on the fly)",
        SEGMENTATION, reads_data_dir=False)
