"""The converters' process pool: the same bytes on disk whatever ``--workers`` is."""

from __future__ import annotations

from pathlib import Path

import pytest

from input_pipelines.core.encode_pool import EncodePool
from input_pipelines.core.errors import DataError
from input_pipelines.tools import folder_to_lmdb, folder_to_tfrecord
from tests.pipeline_data import write_image_folder


def contents(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def test_output_is_identical_for_one_and_two_workers(tmp_path, capsys):
    write_image_folder(tmp_path / "in", classes=3, per_class=7, splits=("train",))
    for workers in (1, 2):
        folder_to_tfrecord.convert(str(tmp_path / "in"), str(tmp_path / f"tf{workers}"), 3, 1,
                                   validation_fraction=0.2, workers=workers)
        folder_to_lmdb.convert(str(tmp_path / "in"), str(tmp_path / f"lmdb{workers}"),
                               encoding="raw", validation_fraction=0.2, workers=workers)
    for name in ("tf", "lmdb"):
        one, two = contents(tmp_path / f"{name}1"), contents(tmp_path / f"{name}2")
        assert one.keys() == two.keys() and len(one) >= 3
        assert one == two, name
    err = capsys.readouterr().err
    assert "21/21 images" in err and "images/s" in err


def test_a_bad_image_in_a_worker_is_named(tmp_path):
    write_image_folder(tmp_path / "in", classes=2, per_class=3, splits=("train",))
    (tmp_path / "in/train/c1/empty.png").write_bytes(b"")
    with pytest.raises(DataError, match=r"c1/empty.png: cannot decode the image: the file is "
                                        "empty"):
        folder_to_lmdb.convert(str(tmp_path / "in"), str(tmp_path / "out"), workers=2)


def test_workers_must_be_positive():
    with pytest.raises(ValueError, match="--workers=0"):
        EncodePool(0)
