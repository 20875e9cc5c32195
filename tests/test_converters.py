"""The converters: round trips, balanced shards, manifests, resuming."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from input_pipelines.core import segmentation_records
from input_pipelines.core.manifest import sha256_file
from input_pipelines.core.stats import compute
from input_pipelines.tools import folder_to_tfrecord, segmentation_to_tfrecord
from tests.pipeline_data import image, seg_sample, write_h5, write_image_folder


def records(path: Path) -> list[dict]:
    out = []
    for raw in tf.data.TFRecordDataset(str(path)).as_numpy_iterator():
        feature = tf.train.Example.FromString(raw).features.feature
        out.append({k: (v.bytes_list.value or v.int64_list.value)[0] for k, v in feature.items()})
    return out


def all_records(out: Path, split: str) -> list[dict]:
    return [r for p in sorted(out.glob(f"{split}-*.tfrecord")) for r in records(p)]


def test_png_folder_round_trip_is_lossless(tmp_path):
    written = write_image_folder(tmp_path / "in", classes=3, per_class=5, fmt="png")
    folder_to_tfrecord.convert(str(tmp_path / "in"), str(tmp_path / "out"), shards=4,
                               validation_shards=2, encoding="keep")
    got = [(split, r) for split in ("train", "validation")
           for r in all_records(tmp_path / "out", split)]
    assert len(got) == len(written)
    for split, record in got:
        path = str(tmp_path / "in" / split / record["image/filename"].decode())
        decoded = tf.io.decode_png(record["image/encoded"]).numpy()
        np.testing.assert_array_equal(decoded, written[path])
        assert record["image/class/label"] == int(Path(path).parent.name[1:])
        assert record["image/class/text"].decode() == Path(path).parent.name
        assert record["image/format"] == b"png"
        assert (record["image/height"], record["image/width"]) == written[path].shape[:2]


def test_jpeg_encoding_keeps_jpegs_and_reencodes_the_rest(tmp_path):
    jpegs = write_image_folder(tmp_path / "in", classes=2, per_class=2, fmt="jpg",
                               splits=("train",))
    folder_to_tfrecord.convert(str(tmp_path / "in"), str(tmp_path / "out"), shards=1,
                               validation_shards=1)
    for record in all_records(tmp_path / "out", "train"):
        path = next(p for p in jpegs if p.endswith(record["image/filename"].decode()))
        assert record["image/encoded"] == Path(path).read_bytes()  # byte for byte
    pngs = write_image_folder(tmp_path / "png", classes=2, per_class=2, splits=("train",))
    folder_to_tfrecord.convert(str(tmp_path / "png"), str(tmp_path / "out2"), shards=1,
                               validation_shards=1, quality=100)
    for record in all_records(tmp_path / "out2", "train"):
        assert tf.io.is_jpeg(record["image/encoded"]) and record["image/format"] == b"jpeg"
        path = next(p for p in pngs if p.endswith(record["image/filename"].decode()))
        same = tf.io.encode_jpeg(tf.io.decode_png(Path(path).read_bytes()), quality=100)
        np.testing.assert_array_equal(tf.io.decode_jpeg(record["image/encoded"]),
                                      tf.io.decode_jpeg(same))


def test_shards_are_balanced_and_the_manifest_describes_them(tmp_path):
    write_image_folder(tmp_path / "in", classes=3, per_class=5, splits=("train",))
    folder_to_tfrecord.convert(str(tmp_path / "in"), str(tmp_path / "out"), shards=4,
                               validation_shards=1)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["classes"] == ["c0", "c1", "c2"] and manifest["task"] == "classification"
    shards = manifest["splits"]["train"]["shards"]
    assert [s["file"] for s in shards] == [f"train-0000{i}-of-00004.tfrecord" for i in range(4)]
    assert [s["examples"] for s in shards] == [4, 4, 4, 3]
    assert manifest["splits"]["train"]["examples"] == 15
    for shard in shards:
        path = tmp_path / "out" / shard["file"]
        assert shard["sha256"] == sha256_file(str(path))
        assert shard["bytes"] == path.stat().st_size
        labels = [r["image/class/label"] for r in records(path)]
        assert len(labels) == shard["examples"]
        assert (shard["label_min"], shard["label_max"]) == (min(labels), max(labels))


def test_the_manifest_records_the_sizes_of_the_training_images(tmp_path, monkeypatch):
    shapes = {"c0/a.png": (20, 24, 3), "c0/b.png": (32, 18, 1), "c1/c.png": (16, 16, 4),
              "c1/d.png": (40, 40, 3)}
    for name, (height, width, channels) in shapes.items():
        (tmp_path / "in" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "in" / name).write_bytes(
            tf.io.encode_png(image(len(name), height, width, channels)).numpy())
    args = (str(tmp_path / "in"), str(tmp_path / "out"))
    kwargs = {"shards": 2, "validation_shards": 1, "validation_fraction": 0.5}
    folder_to_tfrecord.convert(*args, **kwargs)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    held_out = {r["image/filename"].decode() for r in all_records(tmp_path / "out", "validation")}
    trained = [shapes[name] for name in shapes if name not in held_out]
    # As stored: a JPEG has no alpha, so the RGBA image counts as RGB.
    channels = [min(c, 3) for _, _, c in trained]
    assert manifest["image_sizes"] == {
        "images": 2, "height": [min(h for h, _, _ in trained), max(h for h, _, _ in trained)],
        "width": [min(w for _, w, _ in trained), max(w for _, w, _ in trained)],
        "shorter_side_sum": sum(min(h, w) for h, w, _ in trained),
        "channels": {str(c): channels.count(c) for c in sorted(set(channels))}}
    # The training shards of a converter that recorded no sizes are rewritten, not reused.
    with monkeypatch.context() as patch:
        patch.setattr(folder_to_tfrecord, "TRAINING_MARKER", "|pixel_stats")
        folder_to_tfrecord.convert(*args, **kwargs)
    old = json.loads((tmp_path / "out" / "manifest.json").read_text())
    del old["image_sizes"]
    for shard in old["splits"]["train"]["shards"]:
        del shard["stats"]["image_sizes"]
    (tmp_path / "out" / "manifest.json").write_text(json.dumps(old))
    skipped = folder_to_tfrecord.convert(*args, **kwargs)
    assert skipped == {"train": [], "validation": ["validation-00000-of-00001.tfrecord"]}
    rewritten = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert rewritten["image_sizes"] == manifest["image_sizes"]


def test_rerunning_skips_verified_shards_and_rewrites_damaged_or_stale_ones(tmp_path):
    write_image_folder(tmp_path / "in", classes=2, per_class=4, splits=("train",))
    args = (str(tmp_path / "in"), str(tmp_path / "out"))
    assert folder_to_tfrecord.convert(*args, shards=3, validation_shards=1)["train"] == []
    out = tmp_path / "out"
    first = out / "train-00000-of-00003.tfrecord"
    before = {p.name: p.stat().st_mtime_ns for p in out.glob("*.tfrecord")}
    skipped = folder_to_tfrecord.convert(*args, shards=3, validation_shards=1)["train"]
    assert len(skipped) == 3
    assert before == {p.name: p.stat().st_mtime_ns for p in out.glob("*.tfrecord")}
    good = first.read_bytes()
    first.write_bytes(good[:-1] + bytes([good[-1] ^ 1]))
    skipped = folder_to_tfrecord.convert(*args, shards=3, validation_shards=1)["train"]
    assert first.name not in skipped and len(skipped) == 2
    assert first.read_bytes() == good
    folder_to_tfrecord.convert(*args, shards=2, validation_shards=1)
    assert sorted(p.name for p in out.glob("*.tfrecord")) == [
        "train-00000-of-00002.tfrecord", "train-00001-of-00002.tfrecord"]


def test_a_broken_image_stops_the_conversion_naming_it(tmp_path):
    write_image_folder(tmp_path / "in", classes=2, per_class=2, splits=("train",))
    bad = tmp_path / "in" / "train" / "c1" / "bad.png"
    bad.write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 20)
    with pytest.raises(ValueError, match=f"{bad}: cannot decode the image"):
        folder_to_tfrecord.convert(str(tmp_path / "in"), str(tmp_path / "out"), 1, 1)
    assert folder_to_tfrecord.main(["--input_dir", str(tmp_path / "in"), "--output_dir",
                                    str(tmp_path / "out")]) == 2


@pytest.mark.parametrize("suffix", [".h5", ".npz"])
def test_segmentation_round_trip_and_stats(tmp_path, suffix):
    samples = {s: seg_sample(s) for s in range(7)}
    layout = {"train/a": [0, 1, 2], "train/b": [3, 4], "validation/c": [5, 6]}
    for name, seeds in layout.items():
        data = np.stack([samples[s][0] for s in seeds])
        labels = np.stack([samples[s][1] for s in seeds])
        path = tmp_path / "in" / f"{name}{suffix}"
        if suffix == ".h5":
            write_h5(path, data, labels)
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            np.savez(path, data=data, labels=labels)
    out = tmp_path / "out"
    segmentation_to_tfrecord.convert(str(tmp_path / "in"), str(out), shards=2,
                                     validation_shards=1)
    for split, seeds in (("train", range(5)), ("validation", (5, 6))):
        got = [segmentation_records.decode(r)
               for p in sorted(out.glob(f"{split}-*.tfrecord"))
               for r in tf.data.TFRecordDataset(str(p)).as_numpy_iterator()]
        by_seed = {int(d[0, 0, 0]): (d, lab) for d, lab in got}
        assert sorted(by_seed) == list(seeds)
        for seed, (data, labels) in by_seed.items():
            np.testing.assert_array_equal(data, samples[seed][0])
            np.testing.assert_array_equal(labels, samples[seed][1])
    written = json.loads((out / "stats.json").read_text())
    direct = compute(str(tmp_path / "in"), "data", "labels")
    np.testing.assert_allclose(written["mean"], direct["mean"], rtol=1e-9)
    np.testing.assert_allclose(written["std"], direct["std"], rtol=1e-9)
    assert written["class_pixels"] == direct["class_pixels"]
    before = os.path.getmtime(out / "train-00000-of-00002.tfrecord")
    skipped = segmentation_to_tfrecord.convert(str(tmp_path / "in"), str(out), 2, 1)
    assert len(skipped["train"]) == 2
    assert os.path.getmtime(out / "train-00000-of-00002.tfrecord") == before
    assert json.loads((out / "stats.json").read_text())["mean"] == written["mean"]


def test_segmentation_samples_of_another_shape_are_refused(tmp_path):
    data, labels = seg_sample(0)
    write_h5(tmp_path / "in" / "a.h5", data, labels)
    write_h5(tmp_path / "in" / "b.h5", data[:8], labels[:8])
    with pytest.raises(ValueError, match=r"b\.h5: samples have data shape \(8, 16, 2\)"):
        segmentation_to_tfrecord.convert(str(tmp_path / "in"), str(tmp_path / "out"), 1, 1)


def test_a_missing_input_dir_is_named_with_its_flag(tmp_path, capsys):
    args = ["--input_dir", str(tmp_path / "none"), "--output_dir", str(tmp_path / "out")]
    assert folder_to_tfrecord.main(args) == 2
    assert f"error: --input_dir={tmp_path}/none does not exist" in capsys.readouterr().err
    assert segmentation_to_tfrecord.main(args) == 2
    assert f"error: --input_dir={tmp_path}/none does not exist" in capsys.readouterr().err


def test_validation_fraction_holds_out_part_of_each_class(tmp_path):
    written = write_image_folder(tmp_path / "in", classes=3, per_class=8, splits=("",))
    folder_to_tfrecord.convert(str(tmp_path / "in"), str(tmp_path / "out"), shards=2,
                               validation_shards=1, validation_fraction=0.25)
    train = all_records(tmp_path / "out", "train")
    validation = all_records(tmp_path / "out", "validation")
    names = [r["image/filename"] for r in train + validation]
    assert len(names) == len(set(names)) == len(written)  # every image once, in one split
    for label in range(3):
        assert sum(r["image/class/label"] == label for r in validation) == 2  # 25% of 8
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["splits"]["validation"] and manifest["validation_fraction"] == 0.25
    # The same seed holds out the same images: a rerun writes nothing new.
    skipped = folder_to_tfrecord.convert(str(tmp_path / "in"), str(tmp_path / "out"), shards=2,
                                         validation_shards=1, validation_fraction=0.25)
    assert len(skipped["train"]) == 2 and len(skipped["validation"]) == 1


def test_validation_fraction_is_checked(tmp_path):
    write_image_folder(tmp_path / "in", classes=2, per_class=2)  # has validation/
    with pytest.raises(ValueError, match="has a validation/ folder; drop --validation_fraction"):
        folder_to_tfrecord.convert(str(tmp_path / "in"), str(tmp_path / "out"), shards=1,
                                   validation_shards=1, validation_fraction=0.2)
    with pytest.raises(ValueError, match=r"--validation_fraction=1.0 is not valid"):
        folder_to_tfrecord.convert(str(tmp_path / "in"), str(tmp_path / "out"), shards=1,
                                   validation_shards=1, validation_fraction=1.0)


@pytest.mark.parametrize("tool", ["folder_to_tfrecord", "folder_to_lmdb"])
def test_help_answers_without_tensorflow(tool):
    code = ("import runpy, sys\nsys.argv = ['prog', '--help']\n"
            f"try:\n    runpy.run_module('input_pipelines.tools.{tool}', run_name='__main__')\n"
            "except SystemExit as exit:\n    assert not exit.code\n"
            "print('tensorflow' in sys.modules)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[1],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "--input_dir" in proc.stdout and proc.stdout.splitlines()[-1] == "False"
