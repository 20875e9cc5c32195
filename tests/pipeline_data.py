"""Tiny datasets written by the pipeline tests: image folders, TFRecord shards, HDF5 files."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import tensorflow as tf

from input_pipelines.registry import Shard
from tfscale.config.train_config import TrainConfig


def config(data_dir: Path | str, dataset: str, **overrides: object) -> TrainConfig:
    """A small TrainConfig for ``dataset`` reading ``data_dir``."""
    values: dict[str, object] = dict(model="tiny_cnn", dataset=dataset, data_dir=str(data_dir),
                                     image_size=16, num_classes=4, batch_size=4, steps=1,
                                     shuffle_buffer=16, deterministic=True, model_dir="/tmp/x")
    values.update(overrides)
    return TrainConfig(**values)  # type: ignore[arg-type]


def image(seed: int, height: int = 20, width: int = 24, channels: int = 3) -> np.ndarray:
    """A random uint8 image."""
    return np.random.default_rng(seed).integers(0, 256, (height, width, channels), np.uint8)


def write_image_folder(root: Path, classes: int = 3, per_class: int = 4, fmt: str = "png",
                       splits: tuple[str, ...] = ("train", "validation")) -> dict[str, np.ndarray]:
    """Writes ``root/SPLIT/cN/iM.fmt``; returns each image's pixels by path (for PNG, exactly
    what decoding gives back)."""
    written = {}
    seed = 0
    for split in splits:
        base = root / split if split else root
        for c in range(classes):
            folder = base / f"c{c}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(per_class):
                pixels = image(seed)
                seed += 1
                encode = tf.io.encode_png if fmt == "png" else tf.io.encode_jpeg
                path = folder / f"i{i}.{fmt}"
                path.write_bytes(encode(pixels).numpy())
                written[str(path)] = pixels
    return written


def labeled_example(encoded: bytes, label: int) -> bytes:
    """A serialized ImageNet-style example."""
    feature = {
        "image/encoded": tf.train.Feature(bytes_list=tf.train.BytesList(value=[encoded])),
        "image/class/label": tf.train.Feature(int64_list=tf.train.Int64List(value=[label])),
    }
    return tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString()


def write_imagenet(root: Path, files: int = 4, per_file: int = 5, split: str = "train",
                   labels: int = 4) -> list[tuple[int, int]]:
    """Writes ``root/SPLIT-0000N-of-...`` JPEG shards without a manifest; returns the
    (file, record) ids, which are also each record's image seed."""
    root.mkdir(parents=True, exist_ok=True)
    ids = []
    for f in range(files):
        with tf.io.TFRecordWriter(str(root / f"{split}-{f:05d}-of-{files:05d}")) as writer:
            for r in range(per_file):
                seed = f * 1000 + r
                encoded = tf.io.encode_jpeg(image(seed)).numpy()
                writer.write(labeled_example(encoded, seed % labels))
                ids.append((f, r))
    return ids


def write_h5(path: Path, data: np.ndarray, labels: np.ndarray, data_key: str = "data",
             label_key: str = "labels") -> None:
    """One HDF5 file holding ``data`` and ``labels``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as f:
        f[data_key] = data
        f[label_key] = labels


def seg_sample(seed: int, size: int = 16, channels: int = 2,
               classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    """A climate-style sample: float data ``size x size x channels``, int labels, with the
    sample's seed in pixel (0, 0) of channel 0 so tests can identify it."""
    rng = np.random.default_rng(seed)
    data = rng.normal(5.0, 2.0, (size, size, channels)).astype(np.float32)
    data[0, 0, 0] = seed
    return data, rng.integers(0, classes, (size, size)).astype(np.int32)


def every_element(dataset: tf.data.Dataset, batches: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """The first ``batches`` batches as NumPy pairs."""
    return [(x, y) for x, y in dataset.take(batches).as_numpy_iterator()]


ONE = Shard()
SHARDS_2 = (Shard(0, 2, 0, 2), Shard(1, 2, 1, 2))
