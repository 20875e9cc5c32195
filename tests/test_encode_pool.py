"""The converters' process pool: the same bytes on disk whatever ``--workers`` is."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from input_pipelines.core.encode_pool import EncodePool
from input_pipelines.core.errors import DataError
from input_pipelines.core.stats import compute, compute_images
from input_pipelines.tools import folder_to_lmdb, folder_to_tfrecord
from tests.pipeline_data import seg_sample, write_h5, write_image_folder


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


def test_stats_are_the_same_for_one_and_two_workers(tmp_path, capsys):
    # Before the bad-image test, which shuts the pool down: this one reuses its processes.
    write_image_folder(tmp_path / "images", classes=2, per_class=3, splits=("train",))
    for k, count in enumerate((2, 3, 1)):
        samples = [seg_sample(10 * k + i) for i in range(count)]
        write_h5(tmp_path / "seg" / ("validation" if k == 2 else "train") / f"f{k}.h5",
                 np.stack([d for d, _ in samples]), np.stack([lab for _, lab in samples]))
    one, two = (compute_images(str(tmp_path / "images"), workers) for workers in (1, 2))
    assert one == two and one["images"] == 6
    one, two = (compute(str(tmp_path / "seg"), "data", "labels", workers) for workers in (1, 2))
    assert one == two and one["samples"] == 5
    assert {f: v["samples"] for f, v in one["files"].items()} == {
        "train/f0.h5": 2, "train/f1.h5": 3, "validation/f2.h5": 1}
    err = capsys.readouterr().err
    assert "stats: 6/6 images" in err and "images/s" in err
    assert "stats: 3/3 files, 6 samples (" in err and "samples/s)" in err


def test_a_bad_image_in_a_worker_is_named(tmp_path):
    write_image_folder(tmp_path / "in", classes=2, per_class=3, splits=("train",))
    (tmp_path / "in/train/c1/empty.png").write_bytes(b"")
    with pytest.raises(DataError, match=r"c1/empty.png: cannot decode the image: the file is "
                                        "empty"):
        folder_to_lmdb.convert(str(tmp_path / "in"), str(tmp_path / "out"), workers=2)


def test_workers_must_be_positive():
    with pytest.raises(ValueError, match="--workers=0"):
        EncodePool(0)

