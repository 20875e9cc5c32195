"""The segmentation datasets (HDF5, TFRecord) and the statistics tool."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from input_pipelines import PIPELINES
from input_pipelines.registry import Shard
from input_pipelines.tools import segmentation_to_tfrecord, stats
from tests.pipeline_data import ONE, SHARDS_2, config, seg_sample, write_h5


def write_climate(root: Path, files: dict[str, list[int]], batched: bool = True,
                  channels: int = 2, keys: tuple[str, str] = ("data", "labels")) -> None:
    """``files``: relative path -> sample seeds. Many samples per file when ``batched``."""
    for name, seeds in files.items():
        samples = [seg_sample(s, channels=channels) for s in seeds]
        data = np.stack([d for d, _ in samples])
        labels = np.stack([lab for _, lab in samples])
        if not batched:
            data, labels = data[0], labels[0]
        write_h5(root / name, data, labels, *keys)


def make_stats(root: Path, *args: str) -> dict:
    assert stats.main(["--data_dir", str(root), *args]) == 0
    return json.loads((root / "stats.json").read_text())


def read(dataset: str, root: Path, split: str, n: int, shard: Shard = ONE,
         batch_size: int = 2, **overrides: object) -> tuple[list, int | None]:
    cfg = config(root, dataset, input_channels=overrides.pop("input_channels", 2),
                 num_classes=3, **overrides)
    batches = PIPELINES.get(dataset)(cfg, shard, split, batch_size)
    return list(batches.dataset.take(n).as_numpy_iterator()), batches.examples


def seeds_of(batches: list, document: dict) -> list[int]:
    """Recovers each sample's seed from its pixel (0, 0) of channel 0."""
    mean, std = document["mean"][0], document["std"][0]
    return [int(round(float(x[0, 0, 0]) * std + mean)) for images, _ in batches for x in images]


def test_stats_tool_computes_channel_statistics_of_the_training_data(tmp_path):
    write_climate(tmp_path, {"train/a.h5": [0, 1, 2], "train/b.h5": [3],
                             "validation/c.h5": [4]})
    document = make_stats(tmp_path)
    data = np.stack([seg_sample(s)[0] for s in range(4)])
    np.testing.assert_allclose(document["mean"], data.mean(axis=(0, 1, 2)), rtol=1e-5)
    np.testing.assert_allclose(document["std"], data.std(axis=(0, 1, 2)), rtol=1e-5)
    assert document["samples"] == 4 and document["sample_shape"] == [16, 16, 2]
    labels = np.stack([seg_sample(s)[1] for s in range(4)])
    assert document["class_pixels"] == np.bincount(labels.ravel()).tolist()
    assert document["files"]["validation/c.h5"]["split"] == "validation"
    assert document["files"]["train/a.h5"]["samples"] == 3


@pytest.mark.parametrize("batched", [True, False])
def test_h5_samples_are_normalized_with_the_promised_shapes(tmp_path, batched):
    seeds = {"train/a.h5": [0, 1, 2], "train/b.h5": [3, 4, 5]} if batched else {
        f"train/{s}.h5": [s] for s in range(6)}
    write_climate(tmp_path, seeds, batched=batched)
    write_climate(tmp_path, {"validation/v.h5": [9]}, batched=batched)
    document = make_stats(tmp_path)
    got, examples = read("segmentation_h5", tmp_path, "train", 3, shuffle_buffer=0)
    assert examples == 6
    for images, labels in got:
        assert images.shape == (2, 16, 16, 2) and images.dtype == np.float32
        assert labels.shape == (2, 16, 16) and labels.dtype == np.int32
        assert labels.min() >= 0 and labels.max() < 3
    data = np.concatenate([images for images, _ in got])
    np.testing.assert_allclose(data.mean(axis=(0, 1, 2)), 0, atol=1e-4)
    np.testing.assert_allclose(data.std(axis=(0, 1, 2)), 1, atol=1e-4)
    assert sorted(seeds_of(got, document)) == list(range(6))


def test_custom_dataset_names_single_channel_and_cropping(tmp_path):
    for s in range(3):
        data, labels = seg_sample(s, channels=1)
        write_h5(tmp_path / "train" / f"{s}.h5", data[..., 0], labels, "climate", "mask")
    data, labels = seg_sample(7, channels=1)
    write_h5(tmp_path / "validation" / "7.h5", data[..., 0], labels, "climate", "mask")
    document = make_stats(tmp_path, "--data_key", "climate", "--label_key", "mask")
    assert document["data_key"] == "climate"
    got, _ = read("segmentation_h5", tmp_path, "validation", 1, batch_size=1, image_size=8,
                  input_channels=1)
    expected = (data[4:12, 4:12] - document["mean"][0]) / document["std"][0]
    np.testing.assert_allclose(got[0][0][0], expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(got[0][1][0], labels[4:12, 4:12])
    train, _ = read("segmentation_h5", tmp_path, "train", 6, batch_size=1, image_size=8,
                    input_channels=1)
    assert all(x.shape == (1, 8, 8, 1) for x, _ in train)


@pytest.mark.parametrize("record_sharding", [False, True])
def test_two_workers_read_each_sample_once(tmp_path, record_sharding):
    files = {"train/a.h5": [0, 1, 2, 3, 4, 5]} if record_sharding else {
        f"train/{f}.h5": [2 * f, 2 * f + 1] for f in range(4)}
    write_climate(tmp_path, files)
    document = make_stats(tmp_path)
    total = sum(len(s) for s in files.values())
    seen = []
    for shard in SHARDS_2:
        got, examples = read("segmentation_h5", tmp_path, "train", total // 2, shard,
                             batch_size=1, record_sharding=record_sharding)
        assert examples == total // 2
        seen += seeds_of(got, document)
    assert sorted(seen) == list(range(total))


def test_tfrecord_dataset_matches_the_h5_source(tmp_path):
    source, shards = tmp_path / "h5", tmp_path / "records"
    write_climate(source, {"train/a.h5": [0, 1, 2], "train/b.h5": [3, 4],
                           "validation/c.h5": [5, 6]})
    make_stats(source)
    segmentation_to_tfrecord.convert(str(source), str(shards), shards=2, validation_shards=1)
    from_h5, _ = read("segmentation_h5", source, "validation", 1)
    from_records, examples = read("segmentation_tfrecord", shards, "validation", 1)
    assert examples == 2
    np.testing.assert_allclose(from_records[0][0], from_h5[0][0], rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(from_records[0][1], from_h5[0][1])
    train, examples = read("segmentation_tfrecord", shards, "train", 2)
    assert examples == 5 and train[0][0].shape == (2, 16, 16, 2)


def test_a_glob_selects_training_files(tmp_path):
    write_climate(tmp_path, {"train/a.h5": [0, 1], "train/b.h5": [2], "validation/c.h5": [3]})
    make_stats(tmp_path)
    _, examples = read("segmentation_h5", tmp_path / "train" / "a*.h5", "train", 1)
    assert examples == 2


def test_stats_are_required_and_must_fit_the_configuration(tmp_path):
    write_climate(tmp_path, {"train/a.h5": [0, 1]})
    with pytest.raises(ValueError, match="python -m input_pipelines.tools.stats --data_dir"):
        read("segmentation_h5", tmp_path, "train", 1)
    make_stats(tmp_path)
    with pytest.raises(ValueError, match="samples have 2 channels but --input_channels=3"):
        read("segmentation_h5", tmp_path, "train", 1, input_channels=3)
    with pytest.raises(ValueError, match="smaller than --image_size=32"):
        read("segmentation_h5", tmp_path, "train", 1, image_size=32)
