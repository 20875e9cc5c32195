"""The imagenet (TFRecord) and image_folder datasets: shapes, values, labels, sharding."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from input_pipelines import PIPELINES
from input_pipelines.core import image_preprocessing, preprocessing_choice
from input_pipelines.core.errors import DataError
from input_pipelines.core.preprocessing_choice import Preprocessing, resolve_preprocessing
from input_pipelines.registry import Shard
from tests.pipeline_data import (
    ONE,
    SHARDS_2,
    config,
    image,
    labeled_example,
    write_image_folder,
    write_imagenet,
)

MEAN_RGB, STDDEV_RGB = preprocessing_choice.MEAN_RGB, preprocessing_choice.STDDEV_RGB
LOW = min((0 - m) / s for m, s in zip(MEAN_RGB, STDDEV_RGB, strict=True))
HIGH = max((1 - m) / s for m, s in zip(MEAN_RGB, STDDEV_RGB, strict=True))


def resolved(**overrides: object) -> Preprocessing:
    """The preprocessing of a 16-pixel run without dataset statistics (ImageNet's)."""
    return resolve_preprocessing(config("unused", "imagenet", **overrides), None)


EVAL = resolved()  # the whole image at 16 px, ImageNet normalization


def first_batches(dataset: str, data_dir: Path, split: str, n: int, shard: Shard = ONE,
                  batch_size: int = 4, **overrides: object) -> tuple[list, int | None]:
    cfg = config(data_dir, dataset, **overrides)
    batches = PIPELINES.get(dataset)(cfg, shard, split, batch_size)
    return list(batches.dataset.take(n).as_numpy_iterator()), batches.examples


@pytest.mark.parametrize("dataset", ["imagenet", "image_folder"])
@pytest.mark.parametrize("split", ["train", "validation"])
def test_shapes_dtypes_and_value_ranges(tmp_path, dataset, split):
    if dataset == "imagenet":
        write_imagenet(tmp_path, files=2, per_file=6)
        write_imagenet(tmp_path, files=1, per_file=6, split="validation")
    else:
        write_image_folder(tmp_path, classes=4, per_class=3, fmt="jpg")
    got, examples = first_batches(dataset, tmp_path, split, 3, image_size=24)
    assert examples == (12 if split == "train" else 6) if dataset == "imagenet" else 12
    for images, labels in got:  # validation ends with a partial batch
        assert images.shape == (len(labels), 24, 24, 3) and images.dtype == np.float32
        assert labels.shape in ((4,), (2,)) and labels.dtype == np.int32
        assert LOW - 1e-4 <= images.min() and images.max() <= HIGH + 1e-4
        assert images.std() > 0.3  # normalized, not left in [0, 255] or [0, 1]
        assert set(labels) <= set(range(4))


def test_training_augments_differently_each_epoch_and_evaluation_does_not(tmp_path):
    write_imagenet(tmp_path, files=1, per_file=4)
    write_imagenet(tmp_path, files=1, per_file=4, split="validation")
    train, _ = first_batches("imagenet", tmp_path, "train", 2, shuffle_buffer=0, augment="small")
    assert not np.allclose(train[0][0], train[1][0])  # same records, new crops
    assert np.array_equal(train[0][1], train[1][1])
    again, _ = first_batches("imagenet", tmp_path, "train", 2, shuffle_buffer=0, augment="small")
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(train, again, strict=True))
    evaluation, _ = first_batches("imagenet", tmp_path, "validation", 1)
    evaluation_again, _ = first_batches("imagenet", tmp_path, "validation", 1)
    assert np.array_equal(evaluation[0][0], evaluation_again[0][0])


def test_evaluation_takes_the_central_crop():
    pixels = np.zeros((48, 40, 3), np.uint8)
    pixels[14:34, 10:30] = 255  # white centre 20x20, black border
    for encoder in (tf.io.encode_jpeg, tf.io.encode_png):
        out = image_preprocessing.eval_image(encoder(pixels), 16, 3,
                                             resolved(eval_crop_fraction=16 / 48)).numpy()
        white = (1 - np.array(MEAN_RGB)) / STDDEV_RGB
        # 16/48 of the 40-pixel side: a 13x13 central window, all white.
        np.testing.assert_allclose(out, np.broadcast_to(white, out.shape), atol=0.05)


def test_random_resized_crop_stays_inside_the_image_and_flips():
    pixels = np.zeros((32, 32, 3), np.uint8)
    pixels[:, 16:] = 255  # left half black, right half white
    encoded = tf.io.encode_jpeg(pixels, quality=100)
    black = (0 - np.array(MEAN_RGB)) / STDDEV_RGB
    left_is_black = []
    for k in range(24):
        out = image_preprocessing.train_image(encoded, tf.constant([3, k], tf.int64), 16, 3,
                                              resolved(augment="imagenet"))
        out = out.numpy()
        assert out.shape == (16, 16, 3)
        assert LOW - 1e-4 <= out.min() and out.max() <= HIGH + 1e-4
        left_is_black.append(bool(np.allclose(out[:, 0], black, atol=0.3)))
    assert any(left_is_black) and not all(left_is_black)  # flipped in some, not all


def test_grayscale_images(tmp_path):
    write_imagenet(tmp_path, files=1, per_file=4)
    got, _ = first_batches("imagenet", tmp_path, "train", 1, input_channels=1)
    assert got[0][0].shape == (4, 16, 16, 1)
    with pytest.raises(ValueError, match="--input_channels=2"):
        first_batches("imagenet", tmp_path, "train", 1, input_channels=2)


def test_png_records_decode_like_the_png(tmp_path):
    pixels = image(5, 16, 16)
    tmp_path.mkdir(exist_ok=True)
    for split in ("train", "validation"):
        with tf.io.TFRecordWriter(str(tmp_path / f"{split}-00000")) as writer:
            writer.write(labeled_example(tf.io.encode_png(pixels).numpy(), 2))
    got, _ = first_batches("imagenet", tmp_path, "validation", 1, batch_size=1, image_size=12)
    expected = image_preprocessing.eval_image(tf.io.encode_png(pixels), 12, 3, EVAL).numpy()
    np.testing.assert_array_equal(got[0][0][0], expected)
    assert got[0][1][0] == 2


def test_image_folder_labels_follow_sorted_class_folders(tmp_path):
    written = write_image_folder(tmp_path, classes=3, per_class=2, fmt="png")
    got, examples = first_batches("image_folder", tmp_path, "validation", 1, batch_size=6)
    assert examples == 6
    images, labels = got[0]
    paths = [p for p in written if "/validation/" in p]
    assert labels.tolist() == [int(Path(p).parent.name[1:]) for p in paths]
    for row, path in zip(images, paths, strict=True):
        expected = image_preprocessing.eval_image(tf.io.read_file(path), 16, 3, EVAL).numpy()
        np.testing.assert_allclose(row, expected, atol=1e-6)


@pytest.mark.parametrize("record_sharding", [False, True])
def test_two_workers_read_each_record_once(tmp_path, record_sharding):
    # Labels double as record ids: record r of file f has label 5 * f + r.
    files = 2 if record_sharding else 4
    for f in range(files):
        with tf.io.TFRecordWriter(str(tmp_path / f"train-{f:05d}")) as writer:
            for r in range(5):
                writer.write(labeled_example(tf.io.encode_jpeg(image(r)).numpy(), 5 * f + r))
    seen = []
    for shard in SHARDS_2:
        cfg = config(tmp_path, "imagenet", num_classes=5 * files,
                     record_sharding=record_sharding)
        batches = PIPELINES.get("imagenet")(cfg, shard, "train", 1)
        epoch = [int(y[0]) for _, y in batches.dataset.take(batches.examples or 0)
                 .as_numpy_iterator()]
        assert len(epoch) == 5 * files // 2
        seen += epoch
    assert sorted(seen) == list(range(5 * files))


def test_class_folders_without_validation_say_once_that_the_run_does_not_evaluate(
        tmp_path, capsys):
    write_image_folder(tmp_path / "flat", classes=2, per_class=2, splits=("",))
    for _ in range(2):  # the trainer builds the training pipeline more than once
        first_batches("image_folder", tmp_path / "flat", "train", 1, batch_size=2)
    err = capsys.readouterr().err
    assert err.count(f"--data_dir={tmp_path / 'flat'} has no validation/ folder: this run "
                     "trains without evaluation") == 1
    write_image_folder(tmp_path / "split", classes=2, per_class=2)
    first_batches("image_folder", tmp_path / "split", "train", 1, batch_size=2)
    write_image_folder(tmp_path / "other", classes=2, per_class=2, splits=("",))
    first_batches("image_folder", tmp_path / "other", "train", 1, batch_size=2,
                  shard=SHARDS_2[1])  # the first worker says it
    assert "without evaluation" not in capsys.readouterr().err


@pytest.mark.parametrize("record_sharding", [False, True])
def test_image_folder_two_workers_split_the_images(tmp_path, record_sharding):
    written = write_image_folder(tmp_path, classes=2, per_class=3)
    expected = {p: image_preprocessing.eval_image(tf.io.read_file(p), 16, 3, EVAL).numpy()
                for p in written if "/validation/" in p}
    seen = []
    for shard in SHARDS_2:
        got, examples = first_batches("image_folder", tmp_path, "validation", 3, shard,
                                      batch_size=1, record_sharding=record_sharding)
        assert examples == 3
        for images, labels in got:
            match = [p for p, e in expected.items() if np.allclose(images[0], e, atol=1e-6)]
            assert len(match) == 1 and labels[0] == int(Path(match[0]).parent.name[1:])
            seen += match
    assert sorted(seen) == sorted(expected)



def test_a_validation_split_with_fewer_files_than_workers_is_sharded_by_record(tmp_path):
    write_imagenet(tmp_path, files=1, per_file=4, split="train")
    write_imagenet(tmp_path, files=1, per_file=7, split="validation")
    cfg = config(tmp_path, "imagenet")
    seen = []
    for shard in (Shard(0, 2), Shard(1, 2)):
        batches = PIPELINES.get("imagenet")(cfg, shard, "validation", 4)
        labels = [int(y) for _, ys in batches.dataset.as_numpy_iterator() for y in ys]
        assert len(labels) == batches.examples
        seen += labels
    # Each of the 7 images exactly once (the label of record r is r % 4).
    assert sorted(seen) == sorted(r % 4 for r in range(7))
    # Training keeps file-level sharding: one file for two workers is still refused.
    with pytest.raises(DataError, match="1 files in .* for 2 workers"):
        PIPELINES.get("imagenet")(cfg, Shard(0, 2), "train", 4)
