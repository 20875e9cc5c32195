"""Node-local staging: each worker copies its own shards once, verified, atomically."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from input_pipelines import PIPELINES
from input_pipelines.core.errors import CorruptFileError
from input_pipelines.core.files import shard_files, split_files
from input_pipelines.core.manifest import entries_for
from input_pipelines.core.staging import stage
from input_pipelines.tools import folder_to_tfrecord
from tests.pipeline_data import SHARDS_2, config, write_image_folder, write_imagenet


@pytest.fixture
def shards(tmp_path: Path) -> Path:
    write_image_folder(tmp_path / "images", classes=2, per_class=4, splits=("train",))
    folder_to_tfrecord.convert(str(tmp_path / "images"), str(tmp_path / "data"), shards=4,
                               validation_shards=1)
    return tmp_path / "data"


def stage_worker(data: Path, local: Path, worker: int, skip_corrupt: bool = False):
    every = split_files(str(data), "train")
    mine = shard_files(every, SHARDS_2[worker], record_sharding=False)
    return stage(mine, str(data), str(local), SHARDS_2[worker], entries_for(every), skip_corrupt)


def staged_names(local: Path) -> list[str]:
    return sorted(p.name for p in local.iterdir() if p.suffix == ".tfrecord")


def flip_last_byte(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))


def test_each_worker_copies_only_its_shards_once(shards, tmp_path, capsys):
    local = tmp_path / "local"
    first = stage_worker(shards, local, 0)
    assert staged_names(local) == ["train-00000-of-00004.tfrecord",
                                   "train-00002-of-00004.tfrecord"]
    assert sorted(Path(p).name for p in first.copied) == staged_names(local)
    assert first.paths == [str(local / n) for n in staged_names(local)]
    err = capsys.readouterr().err
    assert "staging to" in err and "copied 2, already there and intact 0" in err
    again = stage_worker(shards, local, 0)
    assert again.copied == [] and again.recopied == [] and len(again.skipped) == 2
    other = stage_worker(shards, local, 1)
    assert sorted(Path(p).name for p in other.copied) == ["train-00001-of-00004.tfrecord",
                                                          "train-00003-of-00004.tfrecord"]
    assert not [p for p in local.iterdir() if ".tmp." in p.name]  # no partial copies left


def test_a_damaged_staged_copy_is_copied_again(shards, tmp_path, capsys):
    local = tmp_path / "local"
    stage_worker(shards, local, 0)
    damaged = local / "train-00002-of-00004.tfrecord"
    flip_last_byte(damaged)
    result = stage_worker(shards, local, 0)
    assert [Path(p).name for p in result.recopied] == [damaged.name]
    assert damaged.read_bytes() == (shards / damaged.name).read_bytes()
    assert "was damaged; copied it again" in capsys.readouterr().err


def test_without_a_manifest_the_source_checksum_is_kept_beside_the_copy(tmp_path):
    write_imagenet(tmp_path / "data", files=2, per_file=2)
    local = tmp_path / "local"
    assert len(stage_worker(tmp_path / "data", local, 0).copied) == 1
    assert stage_worker(tmp_path / "data", local, 0).copied == []
    flip_last_byte(local / "train-00000-of-00002")
    assert len(stage_worker(tmp_path / "data", local, 0).recopied) == 1
    source = tmp_path / "data" / "train-00000-of-00002"
    source.write_bytes(source.read_bytes() + b"")
    os.utime(source, ns=(1, 1))  # the source changed: its old checksum no longer counts
    assert len(stage_worker(tmp_path / "data", local, 0).copied) == 1


def test_a_source_that_differs_from_the_manifest_is_refused_or_skipped(shards, tmp_path):
    flip_last_byte(shards / "train-00002-of-00004.tfrecord")
    with pytest.raises(CorruptFileError, match="train-00002-of-00004.tfrecord: its SHA-256"):
        stage_worker(shards, tmp_path / "local", 0)
    result = stage_worker(shards, tmp_path / "local", 0, skip_corrupt=True)
    assert [Path(e.path).name for e in result.corrupt] == ["train-00002-of-00004.tfrecord"]
    assert staged_names(tmp_path / "local") == ["train-00000-of-00004.tfrecord"]


def test_the_pipeline_reads_the_staged_copies(shards, tmp_path):
    local = tmp_path / "local"
    cfg = config(shards, "imagenet", stage_dir=str(local), num_classes=2)
    batches = PIPELINES.get("imagenet")(cfg, SHARDS_2[1], "train", 2)
    assert staged_names(local) == ["train-00001-of-00004.tfrecord",
                                   "train-00003-of-00004.tfrecord"]
    assert batches.examples == 4
    # Damage the source's payload after staging (same size): reading the staged copies works,
    # reading the source fails naming it.
    flip_last_byte(shards / "train-00001-of-00004.tfrecord")
    os.utime(shards / "train-00001-of-00004.tfrecord", ns=(1, 1))
    images, _ = next(iter(PIPELINES.get("imagenet")(cfg, SHARDS_2[1], "train", 2).dataset))
    assert images.shape == (2, 16, 16, 3)
    with pytest.raises(ValueError, match="train-00001-of-00004.tfrecord"):
        PIPELINES.get("imagenet")(cfg.replace(stage_dir=""), SHARDS_2[1], "train", 2)
