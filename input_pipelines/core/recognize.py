"""Recognizers of the built-in datasets: what a ``--data_dir`` holds, read without TensorFlow.

When ``--dataset`` is left out, every dataset of the model's task whose registry entry names a
recognizer (``recognize=``, see :mod:`input_pipelines.registry`) is asked about ``--data_dir``;
a recognizer returns a few words on what it found there (``"a converter's manifest of
classification TFRecord shards"``), or None when the data is not its kind. They look at names,
manifests and a record header at most, so asking them all takes milliseconds.
"""

from __future__ import annotations

import glob
import json
import os
from typing import Any

from input_pipelines.core.class_folders import IMAGE_SUFFIXES
from input_pipelines.core.files import SIDECARS, is_glob
from input_pipelines.core.manifest import MANIFEST
from input_pipelines.core.sample_files import H5_SUFFIXES
from input_pipelines.core.stats import STATS
from input_pipelines.core.tfrecord_scan import masked_crc32c
from tfscale.config.tasks import CLASSIFICATION, SEGMENTATION


def _json(path: str) -> dict[str, Any] | None:
    try:
        with open(path) as f:
            document = json.load(f)
    except (OSError, ValueError):
        return None
    return document if isinstance(document, dict) else None


def _manifest(data_dir: str) -> dict[str, Any] | None:
    """The converter's manifest of ``data_dir``, or None when it has none."""
    manifest = _json(os.path.join(data_dir, MANIFEST))
    return manifest if manifest is not None and "splits" in manifest else None


def _training_files(data_dir: str) -> list[str]:
    """The files a pipeline would train on: a glob's matches, a single file, or a directory's
    ``train-*``, ``train/*`` or (neither there) its own files."""
    if is_glob(data_dir):
        return sorted(p for p in glob.glob(data_dir) if os.path.isfile(p))
    if os.path.isfile(data_dir):
        return [data_dir]
    root = glob.escape(data_dir)
    for pattern in ("train-*", os.path.join("train", "*"), "*"):
        found = sorted(p for p in glob.glob(os.path.join(root, pattern))
                       if os.path.isfile(p) and not p.lower().endswith(SIDECARS))
        if found:
            return found
    return []


def _is_tfrecord(path: str) -> bool:
    """Whether ``path`` starts with a TFRecord header whose length passes its CRC."""
    try:
        with open(path, "rb") as f:
            header = f.read(12)
    except OSError:
        return False
    return len(header) == 12 and masked_crc32c(header[:8]) == int.from_bytes(header[8:], "little")


def _segmentation_stats(data_dir: str) -> bool:
    stats = _json(os.path.join(data_dir, STATS))
    return stats is not None and "sample_shape" in stats


def _tfrecords(data_dir: str, task: str) -> str | None:
    """A converter's manifest of ``task`` TFRecords, or TFRecord shards without one (of
    segmentation when a segmentation stats.json lies beside them)."""
    manifest = _manifest(data_dir) if os.path.isdir(data_dir) else None
    if manifest is not None:
        if manifest.get("format", "tfrecord") == "tfrecord" and manifest.get("task") == task:
            return f"a converter's {MANIFEST} of {task} TFRecord shards"
        return None
    shards = [p for p in _training_files(data_dir) if _is_tfrecord(p)]
    if not shards or _segmentation_stats(data_dir) != (task == SEGMENTATION):
        return None
    return f"{len(shards)} TFRecord training shard(s) without a {MANIFEST}"


def imagenet(data_dir: str) -> str | None:
    """Classification TFRecord shards (``imagenet``)."""
    return _tfrecords(data_dir, CLASSIFICATION)


def segmentation_tfrecord(data_dir: str) -> str | None:
    """Segmentation TFRecord shards (``segmentation_tfrecord``)."""
    return _tfrecords(data_dir, SEGMENTATION)


def image_folder(data_dir: str) -> str | None:
    """Class folders of images, under ``train/`` or directly (``image_folder``)."""
    if not os.path.isdir(data_dir) or _manifest(data_dir) is not None:
        return None
    train = os.path.join(data_dir, "train")
    root = train if os.path.isdir(train) else data_dir
    classes = [e for e in os.scandir(root) if e.is_dir() and not e.name.startswith(".")]
    with_images = [c.name for c in classes
                   if any(f.name.lower().endswith(IMAGE_SUFFIXES) for f in os.scandir(c.path))]
    if not with_images:
        return None
    return f"{len(classes)} class folder(s) of images in {root}"


def segmentation_h5(data_dir: str) -> str | None:
    """HDF5 sample files (``segmentation_h5``)."""
    files = [p for p in _training_files(data_dir) if p.lower().endswith(H5_SUFFIXES)]
    return f"{len(files)} HDF5 training file(s)" if files else None
