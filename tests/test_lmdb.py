"""LMDB datasets: Caffe's Datum wire format, environments written by Caffe's rules read back
bit-exact, per-worker key ranges, the converter, staging and errors."""

from __future__ import annotations

import json
from pathlib import Path

import lmdb
import numpy as np
import pytest
import tensorflow as tf
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

from input_pipelines.core import datum
from input_pipelines.core.errors import DataError
from input_pipelines.core.lmdb_env import MAX_RANGE, range_bounds
from input_pipelines.core.manifest import sha256_file
from input_pipelines.datasets import lmdb as lmdb_dataset
from input_pipelines.registry import has_validation_split, recognize
from input_pipelines.tools import folder_to_lmdb
from tests.conftest import TINY, read_results, run_train
from tests.pipeline_data import ONE, SHARDS_2, config, image, write_image_folder
from tfscale.config.tasks import CLASSIFICATION

F = descriptor_pb2.FieldDescriptorProto
# message Datum of Caffe's src/caffe/proto/caffe.proto (BVLC master), field by field.
CAFFE_DATUM = [("channels", 1, F.TYPE_INT32), ("height", 2, F.TYPE_INT32),
               ("width", 3, F.TYPE_INT32), ("data", 4, F.TYPE_BYTES), ("label", 5, F.TYPE_INT32),
               ("float_data", 6, F.TYPE_FLOAT), ("encoded", 7, F.TYPE_BOOL)]


def caffe_datum_class() -> type:
    """Caffe's ``Datum`` as a protobuf class built from the published field numbers."""
    proto = descriptor_pb2.FileDescriptorProto(name="caffe_datum.proto", package="caffe",
                                               syntax="proto2")
    message = proto.message_type.add(name="Datum")
    for name, number, kind in CAFFE_DATUM:
        label = F.LABEL_REPEATED if name == "float_data" else F.LABEL_OPTIONAL
        field = message.field.add(name=name, number=number, type=kind, label=label)
        if name == "encoded":
            field.default_value = "false"
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return message_factory.GetMessageClass(pool.FindMessageTypeByName("caffe.Datum"))


CaffeDatum = caffe_datum_class()


def caffe_raw(pixels: np.ndarray, label: int) -> bytes:
    """What convert_imageset stores for an RGB/gray image by default (CVMatToDatum): BGR, CHW."""
    bgr = pixels[..., ::-1] if pixels.shape[-1] == 3 else pixels
    message = CaffeDatum(channels=pixels.shape[2], height=pixels.shape[0],
                         width=pixels.shape[1], data=np.transpose(bgr, (2, 0, 1)).tobytes(),
                         encoded=False)
    message.label = label
    return message.SerializeToString()


def caffe_encoded(encoded: bytes, label: int) -> bytes:
    """What convert_imageset --encoded stores (ReadFileToDatum): the file, label, encoded."""
    message = CaffeDatum(data=encoded)
    message.label = label
    message.encoded = True
    return message.SerializeToString()


def write_caffe_lmdb(path: Path, values: list[tuple[str, bytes]]) -> None:
    """An environment as convert_imageset writes it: keys "%08d_%s" in list order."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with lmdb.open(str(path), map_size=2**26) as env, env.begin(write=True) as txn:
        for index, (name, value) in enumerate(values):
            txn.put(f"{index:08d}_{name}".encode(), value)


def plain(root: Path, **overrides: object):
    """A config whose evaluation images are the stored pixels / 255, unchanged."""
    values = dict(image_size=16, num_classes=8, normalization="none", augment="none",
                  horizontal_flip="off", eval_crop_fraction=1.0)
    values.update(overrides)
    return config(root, "lmdb", **values)


def pixels_of(dataset: tf.data.Dataset) -> list[tuple[np.ndarray, int]]:
    return [(np.rint(x * 255).astype(np.uint8), int(y))
            for xs, ys in dataset.as_numpy_iterator() for x, y in zip(xs, ys, strict=True)]


def test_datum_bytes_match_protobufs_serialization_of_caffe_proto():
    raw = datum.Datum(data=bytes(range(24)), label=7, channels=2, height=3, width=4)
    message = CaffeDatum(channels=2, height=3, width=4, data=bytes(range(24)), label=7,
                         encoded=False)
    assert datum.encode(raw) == message.SerializeToString()
    encoded = datum.Datum(data=b"\x89PNG....", label=-3, encoded=True)
    assert datum.encode(encoded) == caffe_encoded(b"\x89PNG....", -3)  # ten-byte varint
    floats = CaffeDatum(channels=1, height=1, width=2, float_data=[1.5, -2.0], label=1)
    assert datum.decode(floats.SerializeToString()).float_data == (1.5, -2.0)
    assert datum.decode(datum.encode(raw)) == raw
    assert datum.decode(message.SerializeToString()) == raw
    assert datum.decode(caffe_encoded(b"abc", -3)) == datum.Datum(b"abc", -3, encoded=True)
    assert datum.caffe_key(12, "cat/1.jpg") == b"00000012_cat/1.jpg"


def test_datum_decoder_refuses_what_is_not_a_datum():
    with pytest.raises(datum.DatumError, match="needs 6 bytes"):
        datum.decode(caffe_encoded(b"abcdef", 1)[:5])
    with pytest.raises(datum.DatumError, match="holds 5 data bytes"):
        datum.decode(datum.encode(datum.Datum(b"12345", 0, channels=3, height=2, width=2)))
    with pytest.raises(datum.DatumError, match="wire type"):
        datum.decode(b"\x0b\x00")  # field 1, wire type 3 (a group)
    example = tf.train.Example().SerializeToString() + b"\x0a\x02\x08\x01"
    with pytest.raises(datum.DatumError):
        datum.decode(example)


@pytest.mark.parametrize("kind", ["raw", "png", "jpeg", "gray"])
def test_caffe_written_environment_reads_back_bit_exact(tmp_path, kind):
    images = [image(seed, 16, 16, 1 if kind == "gray" else 3) for seed in range(7)]
    values = []
    expected = []
    for index, pixels in enumerate(images):
        if kind in ("raw", "gray"):
            values.append((f"c{index % 3}/{index}.png", caffe_raw(pixels, index)))
            expected.append(pixels)
        else:
            encode = tf.io.encode_png if kind == "png" else tf.io.encode_jpeg
            encoded = encode(pixels).numpy()
            values.append((f"c{index % 3}/{index}.{kind}", caffe_encoded(encoded, index)))
            expected.append(tf.io.decode_image(encoded).numpy())
    write_caffe_lmdb(tmp_path / "digits_train_lmdb", values)
    write_caffe_lmdb(tmp_path / "digits_val_lmdb", values[:3])
    # The run evaluates on Caffe's validation environment without being told to: lmdb's own
    # rule finds it, and so does the question asked without a dataset.
    for dataset in ("lmdb", None):
        assert has_validation_split(str(tmp_path), dataset)
        assert not has_validation_split(str(tmp_path / "digits_train_lmdb"), dataset)
    assert not has_validation_split(str(tmp_path), "imagenet")  # not imagenet's layout
    channels = 1 if kind == "gray" else 3
    cfg = plain(tmp_path, input_channels=channels)
    got = pixels_of(lmdb_dataset.build(cfg, ONE, "validation", 2).dataset)
    assert [label for _, label in got] == [0, 1, 2]
    for (pixels, label) in got:
        np.testing.assert_array_equal(pixels, expected[label])
    train = lmdb_dataset.build(cfg, ONE, "train", 1)
    assert train.examples == 7
    seen = pixels_of(train.dataset.take(7))
    assert sorted(label for _, label in seen) == list(range(7))
    for pixels, label in seen:
        np.testing.assert_array_equal(pixels, expected[label])


@pytest.mark.parametrize("record_sharding", [False, True])
def test_two_workers_read_each_record_once_and_evaluate_exactly(tmp_path, record_sharding):
    values = [(f"{i}.png", caffe_raw(image(i, 4, 4), i)) for i in range(45)]
    write_caffe_lmdb(tmp_path / "train", values)
    write_caffe_lmdb(tmp_path / "validation", values[:3])  # fewer records than ranges*workers
    cfg = plain(tmp_path, num_classes=45, image_size=4, record_sharding=record_sharding)
    epoch, evaluated = [], []
    for shard in SHARDS_2:
        train = lmdb_dataset.build(cfg, shard, "train", 1)
        epoch += [label for _, label in pixels_of(train.dataset.take(train.examples))]
        evaluated += [label for _, label in
                      pixels_of(lmdb_dataset.build(cfg, shard, "validation", 2).dataset)]
    assert sorted(epoch) == list(range(45))
    assert sorted(evaluated) == [0, 1, 2]


@pytest.mark.parametrize(("records", "workers"), [(1438, 2), (45, 2), (3, 2), (100_000, 3)])
def test_key_ranges_give_workers_equal_shares(records, workers):
    # Workers whose shares differ across a batch boundary would run different step counts.
    bounds = range_bounds(records, workers)
    assert [b for b, _ in bounds] == [0, *(e for _, e in bounds[:-1])]
    assert bounds[-1][1] == records and len(bounds) % workers in (0, records % workers)
    sizes = [end - begin for begin, end in bounds]
    assert max(sizes) - min(sizes) <= 1 and max(sizes) <= MAX_RANGE
    shares = [sum(sizes[w::workers]) for w in range(workers)]
    assert max(shares) - min(shares) <= 1


def test_converter_writes_caffe_layout_with_manifest_and_resumes(tmp_path):
    written = write_image_folder(tmp_path / "in", classes=3, per_class=3)
    out = tmp_path / "out"
    assert folder_to_lmdb.convert(str(tmp_path / "in"), str(out)) == {"train": [],
                                                                     "validation": []}
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["format"] == "lmdb" and manifest["classes"] == ["c0", "c1", "c2"]
    entry = manifest["splits"]["train"]["shards"][0]
    assert entry["file"] == "train/data.mdb" and entry["examples"] == 9
    assert entry["sha256"] == sha256_file(str(out / "train" / "data.mdb"))
    assert (entry["label_min"], entry["label_max"]) == (0, 2)
    assert manifest["pixel_stats"]["3"]["pixels"] == 9 * 20 * 24
    assert manifest["image_sizes"] == {"images": 9, "height": [20, 20], "width": [24, 24],
                                       "shorter_side_sum": 9 * 20, "channels": {"3": 9}}
    with lmdb.open(str(out / "train"), readonly=True, lock=False) as env, env.begin() as txn:
        keys = [key.decode() for key, _ in txn.cursor()]
        for key, value in txn.cursor():
            name = key.decode()[9:]
            stored = CaffeDatum.FromString(value)  # what Caffe's own parser reads
            assert stored.encoded and stored.data == Path(tmp_path / "in/train" / name).read_bytes()
            assert stored.label == int(name[1])
    assert [k[:9] for k in keys] == [f"{i:08d}_" for i in range(9)]
    assert sorted(k[9:] for k in keys) == sorted(
        str(Path(p).relative_to(tmp_path / "in/train")) for p in written if "/train/" in p)
    assert folder_to_lmdb.convert(str(tmp_path / "in"), str(out))["train"] == ["train/data.mdb"]
    Path(next(p for p in written if "/train/" in p)).write_bytes(
        tf.io.encode_png(image(99, 20, 24)).numpy())
    assert folder_to_lmdb.convert(str(tmp_path / "in"), str(out)) == {
        "train": [], "validation": ["validation/data.mdb"]}


def test_converter_raw_encoding_is_what_caffe_stores(tmp_path):
    written = write_image_folder(tmp_path / "in", classes=2, per_class=2, splits=("train",))
    folder_to_lmdb.convert(str(tmp_path / "in"), str(tmp_path / "out"), encoding="raw")
    with lmdb.open(str(tmp_path / "out/train"), readonly=True, lock=False) as env:
        with env.begin() as txn:
            for key, value in txn.cursor():
                path = str(tmp_path / "in/train" / key.decode()[9:])
                assert value == caffe_raw(written[path], int(Path(path).parent.name[1:]))


def test_errors_name_the_environment_and_the_record(tmp_path):
    with pytest.raises(DataError, match=r"no train LMDB environment: expected .*train/data.mdb"):
        lmdb_dataset.build(plain(tmp_path), ONE, "train", 2)
    cases = [([caffe_raw(image(0, 4, 4), 1), b"not a datum at all"],
              r"train/data.mdb: key 00000001_b: not a Caffe Datum"),
             ([caffe_raw(image(0, 4, 4), 9)], r"key 00000000_a: label 9 is outside \[0, 8\)"),
             ([CaffeDatum(channels=1, height=1, width=1, float_data=[0.5]).SerializeToString()],
              "key 00000000_a: the Datum holds float_data"),
             ([caffe_raw(image(0, 4, 4), 1), caffe_encoded(b"\x89PNG\r\n\x1a\n broken", 1)],
              "key 00000001_b: cannot decode the image")]
    for case, (values, message) in enumerate(cases):
        write_caffe_lmdb(tmp_path / str(case) / "train", list(zip("ab", values, strict=False)))
        with pytest.raises(DataError, match=message):
            lmdb_dataset.build(plain(tmp_path / str(case)), ONE, "train", 2)


def test_caffe_names_and_manifest_checks(tmp_path):
    write_caffe_lmdb(tmp_path / "a_train_lmdb", [("a", caffe_raw(image(0, 4, 4), 0))])
    write_caffe_lmdb(tmp_path / "b_train_lmdb", [("a", caffe_raw(image(0, 4, 4), 0))])
    with pytest.raises(DataError, match="several train environments"):
        lmdb_dataset.build(plain(tmp_path), ONE, "train", 2)
    write_image_folder(tmp_path / "in", classes=3, per_class=2, splits=("train",))
    folder_to_lmdb.convert(str(tmp_path / "in"), str(tmp_path / "out"))
    with pytest.raises(DataError, match=r"out/train/data.mdb: label 2 is outside \[0, 2\)"):
        lmdb_dataset.build(plain(tmp_path / "out", num_classes=2), ONE, "train", 2)


def test_lmdb_is_recognised_without_dataset(tmp_path):
    write_caffe_lmdb(tmp_path / "caffe/ilsvrc12_train_lmdb", [("a", caffe_raw(image(0, 4, 4), 0))])
    assert recognize(str(tmp_path / "caffe"), CLASSIFICATION) == (
        "lmdb", "an LMDB training environment (ilsvrc12_train_lmdb/data.mdb)")
    write_image_folder(tmp_path / "in", classes=2, per_class=1, splits=("train",))
    folder_to_lmdb.convert(str(tmp_path / "in"), str(tmp_path / "out"))
    assert recognize(str(tmp_path / "out"), CLASSIFICATION)[0] == "lmdb"
    assert recognize(str(tmp_path / "out/train"), CLASSIFICATION)[1].endswith(
        "(data.mdb) with a manifest.json")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ValueError, match="no classification dataset recognizes"):
        recognize(str(tmp_path / "empty"), CLASSIFICATION)


def test_staged_copy_is_read(tmp_path, capsys):
    write_image_folder(tmp_path / "in", classes=2, per_class=2)
    folder_to_lmdb.convert(str(tmp_path / "in"), str(tmp_path / "out"))
    cfg = plain(tmp_path / "out", stage_dir=str(tmp_path / "stage"), image_size=20)
    direct = pixels_of(lmdb_dataset.build(plain(tmp_path / "out", image_size=20), ONE,
                                          "validation", 2).dataset)
    staged = pixels_of(lmdb_dataset.build(cfg, ONE, "validation", 2).dataset)
    assert (tmp_path / "stage/validation/data.mdb").is_file()
    assert [label for _, label in staged] == [label for _, label in direct]
    assert "staged 1 file(s)" in capsys.readouterr().err


def test_training_through_the_command(tmp_path):
    write_image_folder(tmp_path / "in", classes=4, per_class=3)
    folder_to_lmdb.main(["--input_dir", str(tmp_path / "in"), "--output_dir",
                         str(tmp_path / "out"), "--encoding", "raw"])
    proc = run_train(*TINY, "--dataset=lmdb", f"--data_dir={tmp_path / 'out'}", "--steps=2",
                     f"--model_dir={tmp_path / 'run'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = read_results(tmp_path / "run")
    assert results["dataset"] == "lmdb" and "val_accuracy" in results["metrics"]
