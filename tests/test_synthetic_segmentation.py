"""The synthetic_seg pipeline: determinism, sharding, class balance, signal, HDF5 files."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

import input_pipelines
from input_pipelines.core import synthetic_fields as synth
from input_pipelines.registry import Shard
from input_pipelines.tools import synthetic_h5
from tfscale.config.train_config import TrainConfig

SIZE, CHANNELS, CLASSES = 48, 16, 3


def _config(**changes: object) -> TrainConfig:
    values = {
        "model": "tiramisu_tiny",
        "dataset": "synthetic_seg",
        "image_size": SIZE,
        "input_channels": CHANNELS,
        "num_classes": CLASSES,
        **changes,
    }
    return TrainConfig(**values)  # type: ignore[arg-type]


def _batches(
    config: TrainConfig,
    shard: Shard | None = None,
    split: str = "train",
    count: int = 1,
    batch: int = 4,
) -> tuple[np.ndarray, np.ndarray]:
    shard = shard or Shard()
    build = input_pipelines.PIPELINES.get("synthetic_seg")
    pairs = list(build(config, shard, split, batch).dataset.take(count).as_numpy_iterator())
    return np.concatenate([p[0] for p in pairs]), np.concatenate([p[1] for p in pairs])


def _samples(count: int, seed: int = 0, height: int = 64, width: int = 64):  # type: ignore[no-untyped-def]
    stream = synth.samples(
        synth.split_seed(seed, 0, "train"), height, width, CHANNELS, CLASSES, count
    )
    pairs = list(stream.as_numpy_iterator())
    return np.stack([p[0] for p in pairs]), np.stack([p[1] for p in pairs])


def test_batches_follow_the_pipeline_contract() -> None:
    config = _config()
    assert input_pipelines.task_of("synthetic_seg") == "segmentation"
    build = input_pipelines.PIPELINES.get("synthetic_seg")
    batches = build(config, Shard(), "train", 4)
    assert batches.examples is None
    spec = batches.dataset.element_spec
    assert tuple(spec[0].shape) == (4, SIZE, SIZE, CHANNELS) and spec[0].dtype.name == "float32"
    assert tuple(spec[1].shape) == (4, SIZE, SIZE) and spec[1].dtype.name == "int32"
    images, labels = _batches(config, count=3)
    assert images.shape[0] == 12 and labels.min() >= 0 and labels.max() < CLASSES
    assert np.all(np.isfinite(images))


def test_deterministic_and_distinct_per_seed_worker_and_split() -> None:
    config = _config()
    first, labels = _batches(config, count=2)
    again, labels_again = _batches(config, count=2)
    assert np.array_equal(first, again) and np.array_equal(labels, labels_again)
    assert not np.array_equal(first[:4], first[4:])  # successive batches differ
    others = [
        _batches(config, Shard(1, 2))[0],
        _batches(_config(seed=1))[0],
        _batches(config, split="validation")[0],
    ]
    for other in others:
        assert not np.allclose(first[:4], other)


def test_validation_is_a_fixed_set_read_once_per_pass() -> None:
    build = input_pipelines.PIPELINES.get("synthetic_seg")
    batches = build(_config(validation_steps=2), Shard(), "validation", 4)
    assert batches.examples == 8
    passes = [[b[0] for b in batches.dataset.as_numpy_iterator()] for _ in range(2)]
    assert [len(p) for p in passes] == [2, 2]
    assert all(np.array_equal(a, b) for a, b in zip(*passes, strict=True))
    assert not np.array_equal(passes[0][0], passes[0][1])


def test_rare_classes_cover_one_to_three_percent_in_coherent_blobs() -> None:
    _, labels = _samples(64)
    frequencies = np.bincount(labels.ravel(), minlength=CLASSES) / labels.size
    assert frequencies[0] > 0.94
    assert np.all((frequencies[1:] > 0.01) & (frequencies[1:] < 0.03)), frequencies
    # Spatially coherent: a rare pixel's right-hand neighbour is almost always of its class
    # (it would be about 2% of the time for scattered pixels).
    left, right = labels[:, :, :-1], labels[:, :, 1:]
    for cls in range(1, CLASSES):
        assert np.mean(right[left == cls] == cls) > 0.8


def test_fields_carry_the_labels() -> None:
    images, labels = _samples(48)
    pixels, truth = images.reshape(-1, CHANNELS), labels.ravel()
    rows = synth.signatures(CLASSES, CHANNELS)
    for cls in range(1, CLASSES):
        # The mean field over an object is its class's signature ...
        assert np.corrcoef(pixels[truth == cls].mean(axis=0), rows[cls])[0, 1] > 0.9
        # ... and a pixel's projection on it separates objects from the background by more
        # than one standard deviation (0 if the fields ignored the labels).
        projection = pixels @ (rows[cls] / np.linalg.norm(rows[cls]))
        background = projection[truth == 0]
        separation = (projection[truth == cls].mean() - background.mean()) / background.std()
        assert separation > 1.0, (cls, separation)
    assert np.abs(pixels[truth == 0].mean(axis=0)).max() < 0.2
    # Class-balanced least squares on a pixel's 16 channels alone, fitted on half the pixels,
    # finds objects in the other half at over twice the IoU of guessing at their frequency.
    half = len(truth) // 2
    design = np.c_[pixels, np.ones(len(pixels))]
    weight = np.sqrt(1.0 / np.bincount(truth[:half])[truth[:half]])[:, None]
    coefficients, *_ = np.linalg.lstsq(
        design[:half] * weight, np.eye(CLASSES)[truth[:half]] * weight, rcond=None
    )
    predicted, test = (design[half:] @ coefficients).argmax(1), truth[half:]
    for cls in range(1, CLASSES):
        found, true = predicted == cls, test == cls
        assert np.sum(found & true) / np.sum(found | true) > 2 * np.mean(true), cls


def test_non_square_samples() -> None:
    images, labels = _samples(2, height=40, width=72)
    assert images.shape == (2, 40, 72, CHANNELS) and labels.shape == (2, 40, 72)


@pytest.mark.parametrize("per_file", [1, 3])
def test_h5_files_hold_the_pipeline_samples(tmp_path: Path, per_file: int) -> None:
    paths = synth.write_h5(str(tmp_path), 5, per_file, 32, 40, CHANNELS, CLASSES, seed=3)
    assert len(paths) == (5 if per_file == 1 else 2)
    expected, expected_labels = _samples(5, seed=3, height=32, width=40)
    data, labels = [], []
    for path in paths:
        with h5py.File(path, "r") as handle:
            assert handle["data"].dtype == np.float32 and handle["labels"].dtype == np.int32
            chunk, chunk_labels = handle["data"][()], handle["labels"][()]
        if per_file == 1:
            assert chunk.shape == (32, 40, CHANNELS) and chunk_labels.shape == (32, 40)
            chunk, chunk_labels = chunk[None], chunk_labels[None]
        data.append(chunk)
        labels.append(chunk_labels)
    assert np.array_equal(np.concatenate(data), expected)
    assert np.array_equal(np.concatenate(labels), expected_labels)


def test_h5_cli_writes_train_and_validation(tmp_path: Path) -> None:
    code = synthetic_h5.main(
        [
            f"--out={tmp_path}",
            "--train=4",
            "--validation=2",
            "--per_file=2",
            "--height=32",
            "--width=32",
            "--channels=4",
        ]
    )
    assert code == 0
    assert sorted(p.name for p in (tmp_path / "train").iterdir()) == [
        "train-00000.h5",
        "train-00001.h5",
    ]
    with h5py.File(tmp_path / "validation" / "validation-00000.h5", "r") as handle:
        assert handle["data"].shape == (2, 32, 32, 4) and handle["labels"].shape == (2, 32, 32)
    with pytest.raises(ValueError, match="per_file=0"):
        synth.write_h5(str(tmp_path), 4, 0, 32, 32, 4, CLASSES)
