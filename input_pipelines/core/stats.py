"""Per-channel normalization statistics of training data, stored beside it as stats.json.

Computed by ``python -m input_pipelines.tools.stats`` (and by the converters as they convert).
Segmentation data: every training sample (HDF5/NumPy files, or the TFRecord shards of
``segmentation_to_tfrecord``) gives ``DATA_DIR/stats.json``: the per-channel mean and standard
deviation of the training data, the class frequencies, the sample shapes, the names of the data
and label datasets, and each file's sample count and label range (validation files included),
which the pipelines use to check labels against ``--num_classes`` before training.

An image folder (class sub-folders, under ``train/`` or directly in ``DATA_DIR``): every
training image decoded gives ``pixel_stats`` (per-channel mean and standard deviation in pixel
units, 0-255, of the images decoded to RGB and to grayscale), what ``--normalization=dataset``
of the ``image_folder`` dataset uses. ``folder_to_tfrecord`` records the same in its manifest.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from input_pipelines.core.errors import DataError
from input_pipelines.core.files import split_files
from input_pipelines.core.manifest import read_json
from input_pipelines.core.report import Progress
from tfscale.tasks import CLASSIFICATION

STATS = "stats.json"
SPLITS = ("train", "validation")


class ChannelStats:
    """Running per-channel count, mean and sum of squared deviations (Chan et al.)."""

    def __init__(self, channels: int) -> None:
        self.count = 0
        self.mean = np.zeros(channels)
        self.m2 = np.zeros(channels)

    def add(self, data: np.ndarray) -> None:
        """Adds the pixels of ``data`` (``... x C``)."""
        pixels = data.reshape(-1, data.shape[-1]).astype(np.float64)
        mean = pixels.mean(axis=0)
        self.merge(len(pixels), mean, ((pixels - mean) ** 2).sum(axis=0))

    def merge(self, count: int, mean: np.ndarray, m2: np.ndarray) -> None:
        """Adds the statistics of another group of ``count`` pixels."""
        if count == 0:
            return
        total = self.count + count
        delta = np.asarray(mean) - self.mean
        self.mean = self.mean + delta * count / total
        self.m2 = self.m2 + np.asarray(m2) + delta**2 * self.count * count / total
        self.count = total

    @property
    def std(self) -> np.ndarray:
        """Population standard deviation; 1 for a constant channel (so it is only centred)."""
        std = np.sqrt(self.m2 / max(self.count, 1))
        return np.where(std > 0, std, 1.0)

    def to_dict(self) -> dict[str, Any]:
        return {"pixels": self.count, "mean": self.mean.tolist(), "m2": self.m2.tolist()}


class ImageStats:
    """:class:`ChannelStats` of images decoded to RGB and to grayscale (``--input_channels`` 3
    and 1: decoders convert between them, so each is measured as a pipeline would decode it)."""

    CHANNELS = (3, 1)

    def __init__(self) -> None:
        self.by_channels = {c: ChannelStats(c) for c in self.CHANNELS}

    def add(self, encoded: bytes, decoded: np.ndarray | None = None) -> None:
        """Adds the pixels of the encoded image ``encoded``; ``decoded`` (its pixels in their
        own channel count, if already at hand) saves decoding it again for that count."""
        import tensorflow as tf

        for channels, stats in self.by_channels.items():
            if decoded is not None and decoded.shape[-1] == channels:
                stats.add(decoded)
            else:
                stats.add(tf.io.decode_image(encoded, channels=channels,
                                             expand_animations=False).numpy())

    def merge(self, saved: dict[str, Any]) -> None:
        """Adds statistics saved by :meth:`to_dict` (e.g. another shard's)."""
        for channels, stats in self.by_channels.items():
            entry = saved[str(channels)]
            stats.merge(entry["pixels"], np.array(entry["mean"]), np.array(entry["m2"]))

    def to_dict(self) -> dict[str, Any]:
        return {str(c): s.to_dict() for c, s in self.by_channels.items()}

    def summary(self) -> dict[str, Any]:
        """The ``pixel_stats`` document: per channel count, pixels, mean and std."""
        return {str(c): {"pixels": s.count, "mean": s.mean.tolist(), "std": s.std.tolist()}
                for c, s in self.by_channels.items()}


def label_range(labels: np.ndarray) -> tuple[int, int]:
    """Smallest and largest label."""
    return int(labels.min()), int(labels.max())


def add_counts(counts: Sequence[int], more: Sequence[int]) -> list[int]:
    """Element-wise sum of two per-class counts of possibly different lengths."""
    merged = np.zeros(max(len(counts), len(more)), np.int64)
    merged[:len(counts)] += np.asarray(counts, np.int64)
    merged[:len(more)] += np.asarray(more, np.int64)
    return [int(v) for v in merged]


def class_pixels(labels: np.ndarray, counts: Sequence[int]) -> list[int]:
    """``counts`` plus the pixels of each class in ``labels`` (non-negative labels)."""
    return add_counts(counts, np.bincount(labels[labels >= 0].ravel()).tolist())


def stats_document(channels: ChannelStats, classes: list[int], sample_shape: Sequence[int],
                   files: dict[str, dict[str, Any]], data_key: str,
                   label_key: str) -> dict[str, Any]:
    """The contents of stats.json."""
    return {
        "version": 1, "data_key": data_key, "label_key": label_key,
        "sample_shape": list(sample_shape), "label_shape": list(sample_shape[:2]),
        "mean": channels.mean.tolist(), "std": channels.std.tolist(),
        "pixels": channels.count, "class_pixels": classes,
        "samples": sum(f["samples"] for f in files.values() if f["split"] == "train"),
        "files": files,
    }


def load_stats(directory: str) -> dict[str, Any] | None:
    """``directory/stats.json``, or ``None`` when absent."""
    path = os.path.join(directory, STATS)
    return read_json(path) if os.path.isfile(path) else None


def _samples(path: str, data_key: str, label_key: str) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    from input_pipelines.core import sample_files

    if path.lower().endswith(sample_files.H5_SUFFIXES + sample_files.NUMPY_SUFFIXES):
        layout = sample_files.inspect(path, data_key, label_key)
        for index in range(layout.samples):
            yield sample_files.read_sample(path, index, layout, data_key, label_key)
        return
    import tensorflow as tf

    from input_pipelines.core import segmentation_records

    for record in tf.data.TFRecordDataset(path).as_numpy_iterator():
        yield segmentation_records.decode(record)


def compute(data_dir: str, data_key: str, label_key: str) -> dict[str, Any]:
    """Reads the data under ``data_dir`` and returns the stats.json document.

    Raises:
        DataError: no training files, or a sample whose shape differs from the first one's.
    """
    splits = {"train": split_files(data_dir, "train")}
    try:
        splits["validation"] = split_files(data_dir, "validation")
    except DataError:
        pass
    all_files = [(s, f) for s, paths in splits.items() for f in paths]
    progress = Progress("stats", len(all_files), sum(os.path.getsize(f) for _, f in all_files))
    channels: ChannelStats | None = None
    classes: list[int] = []
    first: tuple[str, tuple[int, ...]] | None = None
    files: dict[str, dict[str, Any]] = {}
    for split, path in all_files:
        low, high, samples = np.iinfo(np.int64).max, np.iinfo(np.int64).min, 0
        for data, labels in _samples(path, data_key, label_key):
            if first is None:
                first = (path, data.shape)
                channels = ChannelStats(data.shape[-1])
            if data.shape != first[1] or labels.shape != first[1][:2]:
                raise DataError(f"{path}: sample {samples} has data shape {data.shape} and label "
                                f"shape {labels.shape}, but the first sample ({first[0]}) has "
                                f"{first[1]} and {first[1][:2]}")
            bad = np.size(data) - int(np.isfinite(data).sum())
            if bad:
                raise DataError(f"{path}: sample {samples}: {bad} data values are NaN or Inf")
            if split == "train" and channels is not None:
                channels.add(data)
                classes = class_pixels(labels, classes)
            lo, hi = label_range(labels)
            low, high, samples = min(low, lo), max(high, hi), samples + 1
        files[os.path.relpath(path, data_dir)] = {
            "split": split, "samples": samples, "label_min": int(low), "label_max": int(high)}
        progress.advance(os.path.getsize(path), items=1)
    progress.done()
    if channels is None or first is None:
        raise DataError(f"--data_dir={data_dir} has no training samples")
    return stats_document(channels, classes, first[1], files, data_key, label_key)


def is_image_folder(data_dir: str) -> bool:
    """True when the training folder of ``data_dir`` (``train/`` or itself) holds sub-folders
    (classes), which segmentation data never has."""
    train = os.path.join(data_dir, "train")
    folder = train if os.path.isdir(train) else data_dir
    return os.path.isdir(folder) and any(
        e.is_dir() and not e.name.startswith(".") for e in os.scandir(folder))


def compute_images(data_dir: str) -> dict[str, Any]:
    """Decodes the training images of the image folder ``data_dir``; returns stats.json.

    Raises:
        DataError: no class folders or images, or an image that does not decode.
    """
    import tensorflow as tf

    from input_pipelines.core.class_folders import list_images

    folder = list_images(data_dir, "train")
    progress = Progress("stats", len(folder.paths),
                        sum(os.path.getsize(p) for p in folder.paths))
    stats = ImageStats()
    for path in folder.paths:
        with open(path, "rb") as f:
            encoded = f.read()
        try:
            stats.add(encoded)
        except tf.errors.OpError as err:
            raise DataError(f"{path}: cannot decode the image: "
                            f"{err.message.splitlines()[0]}") from None
        progress.advance(len(encoded), items=1)
    progress.done()
    return {"version": 1, "task": CLASSIFICATION, "classes": folder.classes,
            "images": len(folder.paths), "pixel_stats": stats.summary()}
