"""io_check: figures from tiny datasets of each format, the verdict and its advice, and bad input
(one line, exit 2)."""

from __future__ import annotations

import math
import mmap
import os
from pathlib import Path
from typing import Any

import pytest

from input_pipelines.core import page_cache
from input_pipelines.tools import folder_to_lmdb, folder_to_tfrecord, io_check
from tests.pipeline_data import config, write_image_folder

FILES = {"image_folder": 8, "imagenet": 2, "lmdb": 1}  # training files of `formats`
SLOW_MODEL = 0.01  # images/s: slower than any storage or pipeline
FAST_MODEL = 1e9


@pytest.fixture(scope="module")
def formats(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same 8 training images as class folders, TFRecord and LMDB."""
    root = tmp_path_factory.mktemp("io_check")
    write_image_folder(root / "folder", classes=2, per_class=4)
    folder_to_tfrecord.convert(str(root / "folder"), str(root / "tfrecord"), shards=2,
                               validation_shards=1)
    folder_to_lmdb.convert(str(root / "folder"), str(root / "lmdb"))
    return {"image_folder": root / "folder", "imagenet": root / "tfrecord",
            "lmdb": root / "lmdb"}


def measure(data_dir: Path, dataset: str, model: float) -> dict[str, Any]:
    cfg = config(data_dir, dataset, image_size=16, num_classes=2, batch_size=2)
    return io_check.io_check(cfg, workers=1, seconds=0.05, model_images_per_sec=model)


def test_each_format_gives_finite_figures_and_the_slowest_stage_is_the_limit(
        formats: dict[str, Path]) -> None:
    for dataset, data_dir in formats.items():
        result = measure(data_dir, dataset, SLOW_MODEL)
        store, pipe = result["storage"], result["pipeline"]
        figures = [store["cold_mb_s"], store["cold_more_readers_mb_s"], store["warm_mb_s"],
                   *(pipe[k] for k in ("records_cold", *io_check.STAGES))]
        assert all(math.isfinite(f) and f > 0 for f in figures), (dataset, figures)
        assert pipe["images"] == 8 and store["bytes"] > 0, dataset
        # The files each dataset's files= rule lists: 8 images, 2 shards, 1 data.mdb.
        assert store["files"] == FILES[dataset], (dataset, store["files"])
        assert result["limit"] == "model", (dataset, result["rates"])
        assert "input is not the limit" in result["advice"][0]
        assert "limit: model (0.0 images/s)" in io_check.report(result)
        # The same figures against a model faster than any input: the slowest input stage.
        found = io_check.verdict(store, pipe, FAST_MODEL, workers=1, image_size=16)
        assert found.limit in ("storage", "pipeline"), dataset
        assert found.rates[found.limit] == min(found.rates.values()) and found.advice


def _filesystem(path: Path) -> str:
    """The type of the filesystem holding ``path`` (the longest mount point above it)."""
    mounts = [line.split()[1:3] for line in Path("/proc/mounts").read_text().splitlines()]
    path_text = str(path.resolve())
    return max((m for m in mounts if path_text.startswith(m[0])), key=lambda m: len(m[0]))[1]


def test_drop_cache_reports_what_stayed_cached(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(os.urandom(4 * page_cache.CHUNK + 123))
    assert page_cache.read_bandwidth([str(path)], readers=3) > 0
    assert page_cache.cached_bytes(str(path)) == path.stat().st_size  # just read: all cached
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        sum(mapped[i] for i in range(0, len(mapped), mmap.PAGESIZE))  # map every page
        assert page_cache.drop_cache([str(path)]) == 1.0  # mapped pages stay
    dropped = page_cache.drop_cache([str(path)])
    if _filesystem(tmp_path) not in ("tmpfs", "overlay"):  # which keep files in memory
        assert dropped is not None and dropped <= io_check.DROPPED


STORE = {"bytes": 100e6, "cold_mb_s": 10.0, "cold_more_readers_mb_s": 30.0, "warm_mb_s": 1000.0,
         "files": 10}


def test_advice_follows_the_figures() -> None:
    # 1000 images of 100 kB: cold storage gives 100 images/s, the pipeline 400, the model 300.
    pipe = {"images": 1000, "records": 2000.0, "records_cold": 2000.0, "decoded": 500.0,
            "augmented": 400.0}
    found = io_check.verdict(STORE, pipe, 300.0, workers=1, image_size=64)
    assert found.limit == "storage" and found.rates["storage"] == pytest.approx(100.0)
    # The model's 300 images/s need 30 MB/s; 4 readers gave 30 MB/s cold, memory 1000.
    assert "--stage_dir" in found.advice[0] and "30.0 MB/s" in found.advice[0]
    assert found.advice[1].startswith("more parallel reads: 4 readers gave 30.0 MB/s")
    assert found.advice[2].startswith("a cache") and "1000.0 MB/s" in found.advice[2]
    assert found.advice[3].startswith("a lighter format: 100 kB per image")

    fast_store = {**STORE, "cold_mb_s": 1000.0, "cold_more_readers_mb_s": 1000.0}
    decode_bound = {**pipe, "decoded": 50.0, "augmented": 45.0}
    found = io_check.verdict(fast_store, decode_bound, 300.0, workers=1, image_size=64)
    assert found.limit == "pipeline" and found.advice[0].startswith("decoding costs most")
    augment_bound = {**pipe, "augmented": 40.0}
    found = io_check.verdict(fast_store, augment_bound, 300.0, workers=1, image_size=64)
    assert found.advice[0].startswith("augmentation costs most")
    assert "--augment=none delivers 500" in found.advice[1]
    read_bound = {**pipe, "records": 60.0, "records_cold": 20.0, "decoded": 58.0,
                  "augmented": 57.0}
    found = io_check.verdict(fast_store, read_bound, 300.0, workers=2, image_size=64)
    assert found.advice[0].startswith("reading and parsing records costs most")
    assert found.rates["model"] == 600.0  # two workers, one device each
    assert "3.0x faster than cold" in found.advice[2]
    still_cached = {**read_bound, "records_cold_still_cached": 1.0}  # the drop did not take
    found = io_check.verdict(fast_store, still_cached, 300.0, workers=2, image_size=64)
    assert len(found.advice) == 2 and not any("a cache" in a for a in found.advice)


@pytest.mark.parametrize("flags, message", [
    (["--dataset=imagenet", "--data_dir=/no/such/dir"], "--data_dir=/no/such/dir does not exist"),
    (["--dataset=imagenet"], "--data_dir is required"),
    (["--dataset=no_such_dataset", "--data_dir=/tmp"], "no_such_dataset"),
    (["--dataset=synthetic"], "--dataset=synthetic generates its data and reads no files"),
    (["--data_dir=/tmp", "--workers=0"], "workers"),
])
def test_bad_input_exits_2_with_one_line(flags: list[str], message: str,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    assert io_check.main(["io_check", *flags, "--model_images_per_sec=1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and message in err, err
