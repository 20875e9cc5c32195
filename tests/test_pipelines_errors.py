"""Every kind of bad input fails before training with a message naming the file or value."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from input_pipelines import PIPELINES
from input_pipelines.core import checks
from input_pipelines.registry import Shard
from input_pipelines.tools import stats
from tests.conftest import run_train
from tests.pipeline_data import (
    ONE,
    SHARDS_2,
    config,
    image,
    labeled_example,
    seg_sample,
    write_h5,
    write_image_folder,
    write_imagenet,
)


def build(dataset: str, data_dir: Path | str, shard: Shard = ONE, split: str = "train",
          **overrides: object):
    return PIPELINES.get(dataset)(config(data_dir, dataset, **overrides), shard, split, 2)


def truncate(path: Path, by: int = 7) -> None:
    path.write_bytes(path.read_bytes()[:-by])


@pytest.mark.parametrize("dataset", ["imagenet", "image_folder", "segmentation_h5",
                                     "segmentation_tfrecord"])
def test_a_missing_data_dir_is_named(tmp_path, dataset):
    with pytest.raises(ValueError, match=f"--data_dir={tmp_path}/nothing does not exist"):
        build(dataset, tmp_path / "nothing")


def test_a_glob_matching_nothing_is_named(tmp_path):
    write_imagenet(tmp_path, files=1)
    with pytest.raises(ValueError, match=r"--data_dir=.*/valid-\*: the glob matched no data"):
        build("imagenet", f"{tmp_path}/valid-*")


def test_fewer_files_than_workers_suggests_record_sharding(tmp_path):
    write_imagenet(tmp_path, files=1)
    with pytest.raises(ValueError, match="1 files in .* for 2 workers.*--record_sharding"):
        build("imagenet", tmp_path, SHARDS_2[1])
    assert build("imagenet", tmp_path, SHARDS_2[1], record_sharding=True).examples == 2


def test_truncated_and_corrupt_tfrecords_are_named(tmp_path):
    write_imagenet(tmp_path, files=3, per_file=3)
    shard = tmp_path / "train-00001-of-00003"
    good = shard.read_bytes()
    truncate(shard)
    with pytest.raises(ValueError, match=f"{shard}: truncated TFRecord file: record 2"):
        build("imagenet", tmp_path)
    shard.write_bytes(good[:3] + bytes([good[3] ^ 1]) + good[4:])  # the first length
    with pytest.raises(ValueError, match=f"{shard}: corrupt TFRecord file: the header of record 0"):
        build("imagenet", tmp_path)
    shard.write_bytes(good[:-10] + bytes([good[-10] ^ 1]) + good[-9:])  # the last payload
    with pytest.raises(ValueError, match=f"{shard}: corrupt TFRecord file: record 2 fails its CRC"):
        build("imagenet", tmp_path)


def test_skip_corrupt_skips_and_reports_how_many(tmp_path, capsys):
    write_imagenet(tmp_path, files=3, per_file=3)
    truncate(tmp_path / "train-00001-of-00003")
    batches = build("imagenet", tmp_path, skip_corrupt=True)
    assert batches.examples == 6
    err = capsys.readouterr().err
    assert "--skip_corrupt: skipped 1 corrupt file(s) of 3 in the train split" in err
    assert "train-00001-of-00003: truncated" in err
    assert next(iter(batches.dataset))[0].shape == (2, 16, 16, 3)


def test_an_undecodable_image_in_a_record_is_named(tmp_path):
    write_imagenet(tmp_path, files=1, per_file=2)
    path = tmp_path / "train-00000-of-00001"
    with tf.io.TFRecordWriter(str(path)) as writer:
        writer.write(labeled_example(tf.io.encode_jpeg(image(0)).numpy(), 1))
        writer.write(labeled_example(tf.io.encode_jpeg(image(1)).numpy()[:200], 1))
    with pytest.raises(ValueError, match=f"{path}: record 1: cannot decode the image"):
        build("imagenet", tmp_path)


@pytest.mark.parametrize("damage", ["garbage", "truncated"])
def test_an_undecodable_image_file_is_named_or_skipped(tmp_path, capsys, damage):
    write_image_folder(tmp_path, classes=2, per_class=3, fmt="jpg", splits=("train",))
    bad = tmp_path / "train" / "c1" / "i1.jpg"
    bad.write_bytes(b"not an image" if damage == "garbage" else bad.read_bytes()[:100])
    with pytest.raises(ValueError, match=f"{bad}: cannot decode the image"):
        build("image_folder", tmp_path)
    assert build("image_folder", tmp_path, skip_corrupt=True).examples == 5
    assert "skipped 1 corrupt file(s) of 6" in capsys.readouterr().err


def test_labels_outside_the_classes_are_named(tmp_path):
    path = tmp_path / "train-00000-of-00001"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for label in (0, 3, 7):
            writer.write(labeled_example(tf.io.encode_jpeg(image(label)).numpy(), label))
    with pytest.raises(ValueError, match=rf"{path}: record 2: label 7 is outside \[0, 4\) "
                                         r"\(--num_classes=4\)"):
        build("imagenet", tmp_path)
    write_image_folder(tmp_path / "folder", classes=5, per_class=1, splits=("train",))
    with pytest.raises(ValueError, match="class folder 'c4' would get label 4, outside"):
        build("image_folder", tmp_path / "folder")


def test_large_data_is_checked_by_manifest_and_inside_the_pipeline(tmp_path, monkeypatch):
    monkeypatch.setattr(checks, "FULL_CHECK_BYTES", 0)
    path = tmp_path / "train-00000-of-00001"
    with tf.io.TFRecordWriter(str(path)) as writer:
        for label in (1, 9):
            writer.write(labeled_example(tf.io.encode_jpeg(image(label)).numpy(), label))
    batches = build("imagenet", tmp_path, shuffle_buffer=0)
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"label outside \[0, 4\)"):
        next(iter(batches.dataset))
    (tmp_path / "manifest.json").write_text(
        '{"splits": {"train": {"shards": [{"file": "train-00000-of-00001", "examples": 2,'
        ' "label_min": 1, "label_max": 9}]}}}')
    with pytest.raises(ValueError, match=f"{path}: label 9 is outside"):
        build("imagenet", tmp_path)


def climate(root: Path, names: list[str], size: int = 16) -> None:
    for i, name in enumerate(names):
        data, labels = seg_sample(i, size=size)
        write_h5(root / name, data, labels)


def test_h5_samples_of_another_shape_are_named(tmp_path):
    climate(tmp_path, ["train/a.h5", "train/b.h5"])
    stats.main(["--data_dir", str(tmp_path)])
    climate(tmp_path, ["train/c.h5"], size=20)
    with pytest.raises(ValueError, match=rf"train/c.h5: samples have data shape \(20, 20, 2\) "
                                         rf"and label shape \(20, 20\), but the first file "
                                         rf"{tmp_path}/train/a.h5 has \(16, 16, 2\)"):
        build("segmentation_h5", tmp_path, input_channels=2)


def test_h5_labels_outside_the_classes_are_named(tmp_path):
    climate(tmp_path, ["train/a.h5", "train/b.h5"])
    stats.main(["--data_dir", str(tmp_path)])  # labels 0..2
    with pytest.raises(ValueError, match=r"train/a.h5: label 2 is outside \[0, 2\)"):
        build("segmentation_h5", tmp_path, input_channels=2, num_classes=2)
    data, labels = seg_sample(5)
    write_h5(tmp_path / "train" / "late.h5", data, np.full_like(labels, -1))  # not in stats
    with pytest.raises(ValueError, match=r"train/late.h5: sample 0: label -1 is outside"):
        build("segmentation_h5", tmp_path, input_channels=2, num_classes=3)


def test_unreadable_h5_files_and_missing_names(tmp_path, capsys):
    climate(tmp_path, ["train/a.h5", "train/b.h5"])
    stats.main(["--data_dir", str(tmp_path)])
    (tmp_path / "train" / "a.h5").write_bytes(b"\x89HDF\r\n\x1a\n" + b"\0" * 50)  # the first
    with pytest.raises(ValueError, match="train/a.h5: cannot open it"):
        build("segmentation_h5", tmp_path, input_channels=2)
    assert build("segmentation_h5", tmp_path, input_channels=2, skip_corrupt=True).examples == 1
    assert "skipped 1 corrupt file(s) of 2" in capsys.readouterr().err
    other = tmp_path / "other"
    climate(other, ["train/a.h5"])
    stats.main(["--data_dir", str(other)])
    data, labels = seg_sample(0)
    write_h5(other / "train" / "b.h5", data, labels, "data", "mask")
    with pytest.raises(ValueError, match="train/b.h5 has no dataset 'labels'; it has: data, mask"):
        build("segmentation_h5", other, input_channels=2)


CLI = ["--steps=2", "--batch_size=2", "--image_size=16", "--num_classes=4",
       "--tensorboard=false"]


def test_the_trainer_reports_bad_data_in_one_line(tmp_path):
    write_imagenet(tmp_path / "records", files=2, per_file=2)
    truncate(tmp_path / "records" / "train-00001-of-00002")
    with tf.io.TFRecordWriter(str(tmp_path / "labels-00000")) as writer:
        writer.write(labeled_example(tf.io.encode_jpeg(image(0)).numpy(), 4))
    write_image_folder(tmp_path / "folder", classes=5, per_class=1, splits=("train",))
    write_image_folder(tmp_path / "broken", classes=4, per_class=2, splits=("train",))
    (tmp_path / "broken" / "train" / "c0" / "i1.png").write_bytes(b"GIF89a...")
    climate(tmp_path / "climate", ["train/a.h5", "train/b.h5"])
    stats.main(["--data_dir", str(tmp_path / "climate")])
    climate(tmp_path / "climate", ["train/c.h5"], size=20)
    tiramisu = ["--model=tiramisu_tiny", "--dataset=segmentation_h5", "--input_channels=2"]
    cases = [
        (["--dataset=imagenet", f"--data_dir={tmp_path}/absent"],
         f"--data_dir={tmp_path}/absent does not exist"),
        (["--dataset=imagenet", f"--data_dir={tmp_path}/records/valid*"],
         f"--data_dir={tmp_path}/records/valid*: the glob matched no data files"),
        (["--dataset=imagenet", f"--data_dir={tmp_path}/records"],
         f"{tmp_path}/records/train-00001-of-00002: truncated TFRecord file"),
        (["--dataset=imagenet", f"--data_dir={tmp_path}/labels-00000"],
         f"{tmp_path}/labels-00000: record 0: label 4 is outside [0, 4)"),
        (["--dataset=image_folder", f"--data_dir={tmp_path}/folder"],
         "--num_classes=4 contradicts the data, which has 5 classes (c0, c1, c2, c3, c4) "
         f"according to the class folders in {tmp_path}/folder/train: label 4 would be out of "
         "range"),
        (["--dataset=image_folder", f"--data_dir={tmp_path}/broken"],
         f"{tmp_path}/broken/train/c0/i1.png: cannot decode the image"),
        ([*tiramisu, f"--data_dir={tmp_path}/climate"],
         f"{tmp_path}/climate/train/c.h5: samples have data shape (20, 20, 2)"),
    ]

    def train(case: int) -> subprocess.CompletedProcess[str]:
        flags = cases[case][0]
        model = [] if "--model=tiramisu_tiny" in flags else ["--model=tiny_cnn"]
        return run_train(*CLI, *model, *flags, f"--model_dir={tmp_path}/run{case}", timeout=120)

    # Two at a time: each run is mostly TensorFlow's import, on one core.
    with ThreadPoolExecutor(2) as pool:
        procs = list(pool.map(train, range(len(cases))))
    for (_, message), proc in zip(cases, procs, strict=True):
        assert proc.returncode == 2, proc.stderr[-2000:]
        assert f"error: {message}" in proc.stderr
        assert "Traceback" not in proc.stderr
    proc = run_train(*CLI, "--model=tiny_cnn", "--dataset=imagenet",
                     f"--data_dir={tmp_path}/records", "--skip_corrupt",
                     f"--model_dir={tmp_path}/run2", timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "skipped 1 corrupt file(s) of 2" in proc.stderr
