"""Classification straight from image folders (one sub-folder per class), for small data.

Layout as in :mod:`input_pipelines.core.class_folders`. Each image file is one record, so sharding
is by image (``--record_sharding`` changes nothing). Before training each worker checks that its
images look like images (their first bytes), and, when they total at most
:data:`~input_pipelines.core.checks.FULL_CHECK_BYTES`, decodes every one; a bad image fails the run
naming the file, or is skipped and reported with ``--skip_corrupt``. Preprocessing is that of the
``imagenet`` dataset (:mod:`input_pipelines.core.image_preprocessing`); pixel statistics for
``--normalization=dataset`` come from ``DATA_DIR/stats.json`` (``python -m
input_pipelines.tools.stats --data_dir DATA_DIR``). Without a ``validation/`` folder the run
has nothing to evaluate on, and the first worker says so.
"""

from __future__ import annotations

import os

import tensorflow as tf

from input_pipelines.core import checks, mechanics, report
from input_pipelines.core.class_folders import (
    IMAGE_SUFFIXES,
    ImageFolder,
    check_signature,
    has_validation,
    list_images,
)
from input_pipelines.core.corrupt import CorruptFiles
from input_pipelines.core.errors import CorruptFileError, DataError
from input_pipelines.core.files import shard_files
from input_pipelines.core.image_preprocessing import (
    classification_transform,
    decodes,
    run_preprocessing,
    validate_channels,
)
from input_pipelines.core.staging import stage
from input_pipelines.registry import Batches, Shard
from tfscale.config.settings import DataSettings


def check_classes(folder: ImageFolder, num_classes: int) -> None:
    """Raises ``DataError`` when there are more class folders than ``num_classes``."""
    if len(folder.classes) > num_classes:
        name = folder.classes[num_classes]
        raise DataError(f"{folder.root} has {len(folder.classes)} class folders but "
                        f"--num_classes={num_classes}: class folder '{name}' would get label "
                        f"{num_classes}, outside [0, {num_classes})")


def read_image_file(path: tf.Tensor, first: tf.Tensor, count: tf.Tensor) -> tf.data.Dataset:
    """A :data:`~input_pipelines.core.mechanics.Reader`: an image file is one record, its path."""
    del count
    return tf.data.Dataset.from_tensors((first, path))


def _worker_images(config: DataSettings, shard: Shard,
                   split: str) -> tuple[list[str], list[int], list[str]]:
    """This worker's image paths (staged if staging), labels and source names, checked."""
    folder = list_images(config.data_dir, split)
    check_classes(folder, config.num_classes)
    if folder.ignored:
        report.warn(shard, f"ignored {len(folder.ignored)} file(s) that are not images "
                           f"({' '.join(IMAGE_SUFFIXES)}), e.g. {folder.ignored[0]}")
    mine = shard_files(folder.paths, shard, record_sharding=False, unit="images",
                       hint="add images or use fewer workers")
    label_of = dict(zip(folder.paths, folder.labels, strict=True))
    corrupt = CorruptFiles(config.skip_corrupt)
    for path in mine:
        try:
            check_signature(path)
        except CorruptFileError as err:
            corrupt.add(err)
    if sum(os.path.getsize(p) for p in mine) <= checks.FULL_CHECK_BYTES:
        rest = corrupt.keep(mine)
        channels = config.input_channels
        corrupt.add_all(checks.check_files(
            rest, [label_of[p] for p in rest],
            lambda p, label: decodes(tf.io.read_file(p), label, channels),
            config.num_classes))
    corrupt.report(shard, split, len(mine))
    sources = corrupt.keep(mine)
    paths = sources
    if config.stage_dir:
        paths = stage(sources, config.data_dir, config.stage_dir, shard, {}).paths
    return paths, [label_of[s] for s in sources], sources


_noted: set[str] = set()


def note_no_evaluation(config: DataSettings, shard: Shard) -> None:
    """Says, once per process and on the first worker, that class folders without a
    ``validation/`` folder give a run without evaluation (nothing else would say so)."""
    if (shard.index or config.validation_steps or config.data_dir in _noted
            or has_validation(config.data_dir)):
        return
    _noted.add(config.data_dir)
    report.note(shard, f"--data_dir={config.data_dir} has no validation/ folder: this run "
                "trains without evaluation (to evaluate, move the class folders into "
                f"{os.path.join(config.data_dir, 'train')}/ and held-out images into "
                f"{os.path.join(config.data_dir, 'validation')}/CLASS/, or convert with python "
                "-m input_pipelines.tools.folder_to_tfrecord --validation_fraction=0.2)")


def build(config: DataSettings, shard: Shard, split: str, batch_size: int) -> Batches:
    """The ``image_folder`` pipeline of worker ``shard`` (see the module docstring)."""
    validate_channels(config.input_channels, "image_folder")
    if split == "train":
        note_no_evaluation(config, shard)
    paths, labels, _ = _worker_images(config, shard, split)
    table = tf.lookup.StaticHashTable(
        tf.lookup.KeyValueTensorInitializer(paths, tf.constant(labels, tf.int64)), -1)

    def parse(path: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
        return tf.io.read_file(path), table.lookup(path)

    transform = classification_transform(config, split,
                                         run_preprocessing(config, shard, split))
    # Images are already sharded one by one: no further record-level sharding.
    return mechanics.batches(paths, [1] * len(paths), read_image_file, parse, transform,
                             config.replace(record_sharding=False), shard, split, batch_size)
