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
of the ``image_folder`` dataset uses, and ``image_sizes`` (their heights, widths and channels,
see :mod:`input_pipelines.core.image_sizes`). ``folder_to_tfrecord`` records the same in its
manifest.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from input_pipelines.core.errors import DataError
from input_pipelines.core.files import split_files
from input_pipelines.core.image_sizes import KEY as SIZES_KEY
from input_pipelines.core.image_sizes import ImageSizes
from input_pipelines.core.manifest import read_json
from input_pipelines.core.report import Progress
from tfscale.config.tasks import CLASSIFICATION

STATS = "stats.json"
SPLITS = ("train", "validation")
# Below this much data, --workers=0 (auto) reads in this process: each worker process imports
# TensorFlow (about 6 s on a 2-core machine), longer than a small folder takes to read.
AUTO_POOL_BYTES = 64 * 2**20


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
    and 1: decoders convert between them, so each is measured as a pipeline would decode it),
    and the images' :class:`~input_pipelines.core.image_sizes.ImageSizes`."""

    CHANNELS = (3, 1)

    def __init__(self) -> None:
        self.by_channels = {c: ChannelStats(c) for c in self.CHANNELS}
        self.sizes = ImageSizes()

    def add(self, encoded: bytes, decoded: np.ndarray | None = None) -> None:
        """Adds the pixels and shape of the encoded image ``encoded``; ``decoded`` (its pixels
        in their own channel count, if already at hand) saves decoding it again."""
        import tensorflow as tf

        if decoded is None:  # in its own channel count: its shape, and one of the statistics
            decoded = tf.io.decode_image(encoded, expand_animations=False).numpy()
        self.sizes.add(decoded.shape)
        for channels, stats in self.by_channels.items():
            if decoded.shape[-1] == channels:
                stats.add(decoded)
            else:
                stats.add(tf.io.decode_image(encoded, channels=channels,
                                             expand_animations=False).numpy())

    def merge(self, saved: dict[str, Any]) -> None:
        """Adds statistics saved by :meth:`to_dict` (e.g. another shard's)."""
        for channels, stats in self.by_channels.items():
            entry = saved[str(channels)]
            stats.merge(entry["pixels"], np.array(entry["mean"]), np.array(entry["m2"]))
        self.sizes.merge(saved[SIZES_KEY])

    def to_dict(self) -> dict[str, Any]:
        return {**{str(c): s.to_dict() for c, s in self.by_channels.items()},
                SIZES_KEY: self.sizes.to_dict()}

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


class FileStats:
    """What one segmentation file contributes to stats.json: its samples' shape (all must
    match the first's), count and label range, and for a training file the channel statistics
    and class pixels. Each file is read alone (on an :class:`EncodePool` worker) and the
    results are merged in file order, so the document is the same for any ``--workers``."""

    def __init__(self) -> None:
        self.path = ""
        self.shape: tuple[int, ...] | None = None
        self.samples = 0
        self.channels: ChannelStats | None = None
        self.classes: list[int] = []

    def read(self, path: str, train: bool, data_key: str, label_key: str) -> tuple[int, int]:
        """Reads every sample of ``path``; returns its smallest and largest label.

        Raises:
            DataError: a sample whose shape differs from the first one's, or non-finite data.
        """
        self.path = path
        low, high = np.iinfo(np.int64).max, np.iinfo(np.int64).min
        for data, labels in _samples(path, data_key, label_key):
            if self.shape is None:
                self.shape = data.shape
                self.channels = ChannelStats(data.shape[-1]) if train else None
            _check_shape(path, self.samples, data.shape, labels.shape, path, self.shape)
            bad = np.size(data) - int(np.isfinite(data).sum())
            if bad:
                raise DataError(f"{path}: sample {self.samples}: {bad} data values are NaN or "
                                "Inf")
            if self.channels is not None:
                self.channels.add(data)
                self.classes = class_pixels(labels, self.classes)
            lo, hi = label_range(labels)
            low, high, self.samples = min(low, lo), max(high, hi), self.samples + 1
        return int(low), int(high)

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "shape": list(self.shape) if self.shape else None,
                "samples": self.samples, "classes": self.classes,
                "channels": self.channels.to_dict() if self.channels else None}

    def merge(self, saved: dict[str, Any]) -> None:
        """Adds another file's :meth:`to_dict`.

        Raises:
            DataError: its samples' shape differs from the first file's.
        """
        shape = tuple(saved["shape"]) if saved["shape"] else None
        if shape is not None:
            if self.shape is None:
                self.path, self.shape = saved["path"], shape
            _check_shape(saved["path"], 0, shape, shape[:2], self.path, self.shape)
        self.samples += saved["samples"]
        channels = saved["channels"]
        if channels is not None:
            if self.channels is None:
                self.channels = ChannelStats(len(channels["mean"]))
            self.channels.merge(channels["pixels"], np.array(channels["mean"]),
                                np.array(channels["m2"]))
            self.classes = add_counts(self.classes, saved["classes"])


def _check_shape(path: str, index: int, shape: Sequence[int], label_shape: Sequence[int],
                 first_path: str, first: Sequence[int]) -> None:
    if tuple(shape) != tuple(first) or tuple(label_shape) != tuple(first[:2]):
        raise DataError(f"{path}: sample {index} has data shape {tuple(shape)} and label "
                        f"shape {tuple(label_shape)}, but the first sample ({first_path}) has "
                        f"{tuple(first)} and {tuple(first[:2])}")


def _read_file(item: tuple[str, bool, str, str], stats: Any) -> tuple[bytes, int, int]:
    """An :data:`~input_pipelines.core.encode_pool.Encode` of (path, train, data_key,
    label_key): no record, the file's label range, its :class:`FileStats` in ``stats``."""
    low, high = stats.read(*item)
    return b"", low, high


def pool_size(workers: int, nbytes: int) -> int:
    """``workers``, or for 0 (auto) every core when there are more than
    :data:`AUTO_POOL_BYTES` to read, else 1."""
    from input_pipelines.core.encode_pool import available_cores

    if workers:
        return workers
    return available_cores() if nbytes > AUTO_POOL_BYTES else 1


def compute(data_dir: str, data_key: str, label_key: str, workers: int = 1) -> dict[str, Any]:
    """Reads the data under ``data_dir``, a file at a time on each of ``workers`` processes (0:
    :func:`pool_size`), and returns the stats.json document.

    Raises:
        DataError: no training files, or a sample whose shape differs from the first one's.
    """
    from input_pipelines.core.encode_pool import EncodePool

    splits = {"train": split_files(data_dir, "train")}
    try:
        splits["validation"] = split_files(data_dir, "validation")
    except DataError:
        pass
    all_files = [(s, f) for s, paths in splits.items() for f in paths]
    nbytes = sum(os.path.getsize(f) for _, f in all_files)
    progress = Progress("stats", len(all_files), nbytes, inside="samples")
    total = FileStats()
    files: dict[str, dict[str, Any]] = {}
    items = [(path, split == "train", data_key, label_key) for split, path in all_files]
    with EncodePool(pool_size(workers, nbytes)) as pool:
        for (split, path), (_, low, high, saved) in zip(
                all_files, pool.map(_read_file, FileStats, items), strict=True):
            assert saved is not None
            total.merge(saved)
            files[os.path.relpath(path, data_dir)] = {
                "split": split, "samples": saved["samples"], "label_min": low,
                "label_max": high}
            progress.advance(os.path.getsize(path), items=1, contents=saved["samples"])
    progress.done()
    if total.channels is None or total.shape is None:
        raise DataError(f"--data_dir={data_dir} has no training samples")
    return stats_document(total.channels, total.classes, total.shape, files, data_key,
                          label_key)


def is_image_folder(data_dir: str) -> bool:
    """True when the training folder of ``data_dir`` (``train/`` or itself) holds sub-folders
    (classes), which segmentation data never has."""
    train = os.path.join(data_dir, "train")
    folder = train if os.path.isdir(train) else data_dir
    return os.path.isdir(folder) and any(
        e.is_dir() and not e.name.startswith(".") for e in os.scandir(folder))


def _image_stats(path: str, stats: Any) -> tuple[bytes, int, int]:
    """An :data:`~input_pipelines.core.encode_pool.Encode` of image paths: no record, the
    image's statistics in ``stats`` (an :class:`ImageStats`)."""
    import tensorflow as tf

    with open(path, "rb") as f:
        encoded = f.read()
    try:
        stats.add(encoded)
    except tf.errors.OpError as err:
        raise DataError(f"{path}: cannot decode the image: "
                        f"{err.message.splitlines()[0]}") from None
    return b"", 0, 0


def compute_images(data_dir: str, workers: int = 1) -> dict[str, Any]:
    """Decodes the training images of the image folder ``data_dir`` on ``workers`` processes
    (0: :func:`pool_size`); returns stats.json. Each image's statistics are merged in order,
    so the result is the same for any number of workers.

    Raises:
        DataError: no class folders or images, or an image that does not decode.
    """
    from input_pipelines.core.class_folders import list_images
    from input_pipelines.core.encode_pool import EncodePool

    folder = list_images(data_dir, "train")
    progress = Progress("stats", len(folder.paths), 0, unit="images")
    stats = ImageStats()
    nbytes = sum(os.path.getsize(p) for p in folder.paths)
    with EncodePool(pool_size(workers, nbytes)) as pool:
        for _, _, _, saved in pool.map(_image_stats, ImageStats, folder.paths):
            assert saved is not None
            stats.merge(saved)
            progress.advance(items=1)
    progress.done()
    return {"version": 1, "task": CLASSIFICATION, "classes": folder.classes,
            "images": len(folder.paths), "pixel_stats": stats.summary(),
            SIZES_KEY: stats.sizes.to_dict()}
