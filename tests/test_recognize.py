"""Choosing --dataset from what --data_dir holds, and refusing a --data_dir nothing reads
(input_pipelines/core/recognize.py, the registry's recognize hook, tfscale.cli.plugins)."""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from absl import flags

import input_pipelines
from input_pipelines.core.tfrecord_scan import masked_crc32c
from tfscale.cli import plugins
from tfscale.cli.flags import config_from_flags, define_flags
from tfscale.config.train_config import TrainConfig


def _tfrecord(path: Path, payload: bytes = b"example") -> None:
    length = struct.pack("<Q", len(payload))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(length + struct.pack("<I", masked_crc32c(length)) + payload
                     + struct.pack("<I", masked_crc32c(payload)))


def _manifest(root: Path, task: str, fmt: str = "tfrecord") -> None:
    _tfrecord(root / "train-00000-of-00001.tfrecord")
    (root / "manifest.json").write_text(json.dumps({"task": task, "format": fmt, "splits": {}}))


def _class_folders(root: Path) -> None:
    for name in ("cat", "dog"):
        (root / "train" / name).mkdir(parents=True)
        (root / "train" / name / "1.png").write_bytes(b"\x89PNG\r\n\x1a\n")


def _h5(root: Path) -> None:
    (root / "train").mkdir(parents=True)
    (root / "train" / "a.h5").write_bytes(b"\x89HDF\r\n\x1a\n")


LAYOUTS: dict[str, tuple[Callable[[Path], None], str, str, str]] = {
    # layout: (make it, model, dataset chosen, what the note says)
    "converter_manifest": (lambda d: _manifest(d, "classification"), "tiny_cnn", "imagenet",
                           "manifest.json of classification TFRecord shards"),
    "shards_without_manifest": (lambda d: _tfrecord(d / "train-00000-of-00002"), "tiny_cnn",
                                "imagenet", "1 TFRecord training shard(s)"),
    "class_folders": (_class_folders, "tiny_cnn", "image_folder", "2 class folder(s)"),
    "hdf5": (_h5, "deeplabv3plus_tiny", "segmentation_h5", "1 HDF5 training file(s)"),
    "segmentation_manifest": (lambda d: _manifest(d, "segmentation"), "deeplabv3plus_tiny",
                              "segmentation_tfrecord", "of segmentation TFRecord shards"),
}


def _config(*argv: str) -> TrainConfig:
    values = flags.FlagValues()
    define_flags(values)
    values(["prog", *argv])
    return config_from_flags(values, plugins.choose_dataset)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_dataset_is_chosen_from_what_data_dir_holds(layout: str, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    make, model, dataset, what = LAYOUTS[layout]
    make(tmp_path)
    config = _config(f"--model={model}", f"--data_dir={tmp_path}")
    assert config.dataset == dataset
    assert config.model_dir == f"runs/{model}-{dataset}-default"
    note = capsys.readouterr().err
    assert f"--dataset not given: --data_dir={tmp_path} holds " in note and what in note
    assert f"using --dataset={dataset}" in note
    plugins.validate_names(config)
    # Given explicitly, --dataset wins and nothing is said.
    assert _config(f"--model={model}", f"--data_dir={tmp_path}", "--dataset=lmdb"
                   if model == "tiny_cnn" else "--dataset=synthetic_seg").dataset != dataset
    assert capsys.readouterr().err == ""


def test_unrecognized_or_missing_data_dir_is_an_error(tmp_path: Path) -> None:
    (tmp_path / "notes.bin").write_bytes(b"not data")
    with pytest.raises(ValueError, match=f"--data_dir={tmp_path}: no classification dataset "
                                         "recognizes what it holds; give --dataset, one of: "
                                         "image_folder, imagenet, lmdb"):
        _config(f"--data_dir={tmp_path}")
    with pytest.raises(ValueError, match=f"^--data_dir={tmp_path}/absent does not exist$"):
        _config(f"--data_dir={tmp_path}/absent")
    # With --dataset given, the directory is checked before any worker starts.
    with pytest.raises(ValueError, match=f"^--data_dir={tmp_path}/absent does not exist$"):
        plugins.validate_names(_config(f"--data_dir={tmp_path}/absent", "--dataset=imagenet"))


def test_data_dir_of_generated_data_is_an_error(tmp_path: Path) -> None:
    config = _config(f"--data_dir={tmp_path}", "--dataset=synthetic", "--steps=5")
    with pytest.raises(ValueError, match=f"--data_dir={tmp_path} is given but --dataset="
                                         "synthetic generates its data and reads no files; "
                                         "drop --data_dir, or choose a dataset that reads it: "
                                         "image_folder, imagenet, lmdb, segmentation_h5"):
        plugins.validate_names(config)


@pytest.fixture
def blobs() -> Iterator[None]:
    """A plugin dataset whose recognizer knows ``*.blob`` files."""

    def recognize(data_dir: str) -> str | None:
        found = list(Path(data_dir).glob("*.blob"))
        return f"{len(found)} blob file(s)" if found else None

    input_pipelines.register("test_blobs", "blobs", task="classification",
                             recognize=recognize)(lambda *args: None)
    yield
    input_pipelines.PIPELINES._entries.pop("test_blobs")


def test_a_plugin_dataset_adds_its_own_recognizer(blobs: None, tmp_path: Path) -> None:
    (tmp_path / "a.blob").write_bytes(b"x")
    assert _config(f"--data_dir={tmp_path}").dataset == "test_blobs"
    # Data two datasets recognize is not guessed at.
    _tfrecord(tmp_path / "train-00000-of-00001")
    (tmp_path / "train-00000-of-00001").rename(tmp_path / "b.blob")
    with pytest.raises(ValueError, match="could be read by several datasets .*give --dataset, "
                                         "one of: imagenet, test_blobs"):
        _config(f"--data_dir={tmp_path}")


def _environment(path: Path) -> None:
    """An LMDB environment, as far as names go (an empty ``data.mdb``)."""
    path.mkdir(parents=True)
    (path / "data.mdb").write_bytes(b"")


READERS = ("image_folder", "imagenet", "lmdb", "segmentation_h5", "segmentation_tfrecord")
SPLIT_LAYOUTS: dict[str, tuple[Callable[[Path], None], set[str]]] = {
    # layout: (make it, the datasets whose has_validation rule finds a validation split there)
    "validation_shards": (lambda d: _tfrecord(d / "validation-00000-of-00001"),
                          {"imagenet", "segmentation_h5", "segmentation_tfrecord"}),
    "validation_folder": (lambda d: (d / "validation").mkdir(), set(READERS)),
    "caffe_validation_environment": (lambda d: _environment(d / "digits_val_lmdb"), {"lmdb"}),
    "caffe_name_without_environment": (lambda d: (d / "digits_val_lmdb").mkdir(), set()),
    "training_only": (lambda d: _tfrecord(d / "train-00000-of-00001"), set()),
}


@pytest.mark.parametrize("layout", sorted(SPLIT_LAYOUTS))
def test_each_dataset_decides_its_validation_split(layout: str, tmp_path: Path) -> None:
    make, finders = SPLIT_LAYOUTS[layout]
    make(tmp_path)
    found = {name for name in READERS
             if input_pipelines.has_validation_split(str(tmp_path), name)}
    assert found == finders
    # Asked without a dataset (a caller that does not know it): any dataset's rule.
    assert input_pipelines.has_validation_split(str(tmp_path)) == bool(finders)
    assert not input_pipelines.has_validation_split(str(tmp_path), "synthetic")
    assert not input_pipelines.has_validation_split("", "imagenet")


def test_each_dataset_lists_the_files_its_builder_reads(tmp_path: Path) -> None:
    def files(name: str, data_dir: Path, split: str = "train") -> list[str]:
        return [str(Path(p).relative_to(data_dir))
                for p in input_pipelines.dataset_files(name, str(data_dir), split)]

    _class_folders(tmp_path / "folders")
    (tmp_path / "folders" / "train" / "cat" / "notes.txt").write_text("not an image")
    assert files("image_folder", tmp_path / "folders") == ["train/cat/1.png", "train/dog/1.png"]
    for env in ("x_train_lmdb", "x_val_lmdb"):
        _environment(tmp_path / "lmdb" / env)
    assert files("lmdb", tmp_path / "lmdb", "validation") == ["x_val_lmdb/data.mdb"]
    _h5(tmp_path / "h5")
    (tmp_path / "h5" / "train" / "README.rst").write_text("not a sample file")
    assert files("segmentation_h5", tmp_path / "h5") == ["train/a.h5"]
    _manifest(tmp_path / "shards", "classification")
    assert files("imagenet", tmp_path / "shards") == ["train-00000-of-00001.tfrecord"]
    with pytest.raises(ValueError, match="has no validation files"):
        files("imagenet", tmp_path / "shards", "validation")
    with pytest.raises(ValueError, match="--dataset=synthetic generates its data"):
        files("synthetic", tmp_path)
