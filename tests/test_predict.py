"""The exported model for inference (tfscale.training.export) and ``python -m tfscale.predict``.

One tiny run, trained once for the module: images of two sizes in four named classes,
converted to TFRecords (the converter re-encodes them as JPEG) and trained with an evaluation
crop of 0.875, so that the export has to crop, resize and normalize as evaluation does.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

import input_pipelines
from input_pipelines.datasets.imagenet import parse
from input_pipelines.tools import folder_to_tfrecord, stats
from tests.conftest import run_process
from tests.pipeline_data import image, seg_sample, write_h5
from tfscale.cli import plugins
from tfscale.cluster.shard import Shard
from tfscale.config.train_config import TrainConfig
from tfscale.training import trainer
from tfscale.training.export import export_inference

CLASSES = ["ant", "bee", "cat", "dog"]
SIZES = [(20, 24), (30, 22)]  # (height, width): neither square nor the trained 16


def write_folder(root: Path, per_class: int, seed: int) -> None:
    for c, name in enumerate(CLASSES):
        (root / name).mkdir(parents=True)
        for i in range(per_class):
            pixels = image(seed + 10 * c + i, *SIZES[i % 2])
            (root / name / f"{i}.png").write_bytes(tf.io.encode_png(pixels).numpy())


def run_config(data_dir: Path, model_dir: Path, **overrides: Any) -> TrainConfig:
    values: dict[str, Any] = dict(
        model="tiny_cnn", dataset="imagenet", data_dir=str(data_dir), image_size=16,
        num_classes=4, batch_size=4, steps=2, epochs=1, eval_crop_fraction=0.875,
        log_every=1, tensorboard=False, model_dir=str(model_dir))
    values.update(overrides)
    return TrainConfig(**values)


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("predict")
    write_folder(root / "png" / "train", per_class=2, seed=0)
    write_folder(root / "png" / "validation", per_class=3, seed=100)
    # One validation shard: the pipeline reads its records in order.
    assert folder_to_tfrecord.main([
        "--input_dir", str(root / "png"), "--output_dir", str(root / "records"),
        "--shards", "2", "--validation_shards", "1", "--workers", "1"]) == 0
    config = run_config(root / "records", root / "run")
    trainer.run(config, plugins.parts(config))
    return {"root": root, "records": root / "records", "run": root / "run"}


def test_the_export_predicts_what_evaluation_computes_from_raw_images(
        trained: dict[str, Path]) -> None:
    # deterministic: the pipeline's batches in record order (its parallel map may reorder).
    cfg = run_config(trained["records"], trained["run"], deterministic=True)
    export = trained["run"] / "export"
    info = (export / "inference.json").read_text()
    assert '"classes": [\n    "ant",' in info and '"dtype": "uint8"' in info
    # Evaluation: the validation pipeline's preprocessed batches through the trained model.
    batches = input_pipelines.PIPELINES.get("imagenet")(cfg, Shard(), "validation", 5)
    model = keras.models.load_model(trained["run"] / "model.keras")
    evaluated = np.concatenate([model(x, training=False).numpy() for x, _ in batches.dataset])
    # Export: the same records' raw pixels, decoded in full, at their own sizes.
    [shard] = sorted(trained["records"].glob("validation-*"))
    served = tf.saved_model.load(str(export))
    raw = [tf.io.decode_image(parse(r)[0], channels=3) for r in tf.data.TFRecordDataset(
        str(shard))]
    assert {tuple(r.shape[:2]) for r in raw} == set(SIZES)
    exported = np.concatenate([served.serve(r[None])["logits"].numpy() for r in raw])
    assert exported.shape == evaluated.shape == (12, 4)
    np.testing.assert_allclose(exported, evaluated, atol=1e-5, rtol=0)
    # A batch of one size gives the same as its images one by one.
    same = [r for r in raw if tuple(r.shape[:2]) == SIZES[0]]
    batched = served.serve(tf.stack(same))["probabilities"].numpy()
    one_by_one = np.concatenate([served.serve(r[None])["probabilities"].numpy()
                                 for r in same])
    np.testing.assert_allclose(batched, one_by_one, atol=1e-6)


def predict(*args: str) -> Any:
    return run_process([sys.executable, "-m", "tfscale.predict", *args], timeout=120)


def test_predict_prints_named_top_classes_of_a_folder(trained: dict[str, Path]) -> None:
    folder = trained["root"] / "png" / "validation"
    proc = predict(f"--model_dir={trained['run']}", "--top_k=2", str(folder))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "--model=tiny_cnn trained on --dataset=imagenet to step 2; 4 classes (names from " \
           in proc.stderr
    lines = proc.stdout.splitlines()
    paths = sorted(folder.rglob("*.png"))
    assert [line.split("  ")[0] for line in lines] == [str(p) for p in paths]
    served = tf.saved_model.load(str(trained["run"] / "export"))
    for path, line in zip(paths, lines, strict=True):
        pixels = tf.io.decode_png(path.read_bytes(), channels=3)
        probabilities = served.serve(pixels[None])["probabilities"].numpy()[0]
        first, second = np.argsort(-probabilities)[:2]
        assert line == (f"{path}  {CLASSES[first]} {probabilities[first]:.3f}  "
                        f"{CLASSES[second]} {probabilities[second]:.3f}")


def test_predict_refuses_bad_input_in_one_line(trained: dict[str, Path],
                                               tmp_path: Path) -> None:
    # A run on generated data exports nothing, and predict says so.
    synthetic = tmp_path / "synthetic"
    config = TrainConfig(model="tiny_cnn", image_size=16, num_classes=4, batch_size=4, steps=1,
                         epochs=1, tensorboard=False, model_dir=str(synthetic))
    trainer.run(config, plugins.parts(config))
    assert (synthetic / "model.keras").exists() and not (synthetic / "export").exists()
    good = next((trained["root"] / "png" / "validation").rglob("*.png"))
    not_image = tmp_path / "notes.png"
    not_image.write_text("not an image")
    truncated = tmp_path / "truncated.png"
    truncated.write_bytes(good.read_bytes()[:60])
    run = f"--model_dir={trained['run']}"
    cases = [
        ([f"--model_dir={synthetic}", str(good)], "holds no exported model"),
        ([f"--model_dir={tmp_path / 'nowhere'}", str(good)], "does not exist"),
        ([run], "give the images to predict"),
        ([run, str(tmp_path / "missing.jpg")], "missing.jpg: no such file or folder"),
        ([run, str(tmp_path / "synthetic")], "the folder holds no .jpg .jpeg .png .gif .bmp"),
        ([run, str(good), str(not_image)], f"{not_image}: cannot decode the image"),
        ([run, str(good), str(truncated)], f"{truncated}: cannot decode the image"),
    ]
    for args, message in cases:
        proc = predict(*args)
        errors = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
        assert proc.returncode == 2 and len(errors) == 1 and message in errors[0], (
            args, proc.stdout, proc.stderr[-2000:])
        assert proc.stdout == ""


def test_a_segmentation_export_crops_and_normalizes_as_evaluation(tmp_path: Path) -> None:
    # The export of a segmentation dataset, without training (the trainer's path is the one
    # tested above): any fully convolutional model shows the crop and normalization.
    data_dir = tmp_path / "data"
    for split, seeds in (("train", [0, 1]), ("validation", [4, 5, 6])):
        samples = [seg_sample(s, size=24) for s in seeds]  # cropped to 16 by evaluation
        write_h5(data_dir / split / "a.h5", np.stack([d for d, _ in samples]),
                 np.stack([labels for _, labels in samples]))
    assert stats.main(["--data_dir", str(data_dir)]) == 0
    cfg = run_config(data_dir, tmp_path / "run", num_classes=3, dataset="segmentation_h5",
                     input_channels=2, deterministic=True)
    inputs = keras.Input((16, 16, 2))
    model = keras.Model(inputs, keras.layers.Conv2D(3, 3, padding="same")(inputs))
    inference = input_pipelines.inference_for(cfg)
    assert inference is not None and inference.dtype == "float32"
    export_inference(model, tmp_path / "export", inference.preprocess, inference.dtype,
                     inference.channels, {"task": inference.task})
    batches = input_pipelines.PIPELINES.get("segmentation_h5")(cfg, Shard(), "validation", 2)
    evaluated = np.concatenate([model(x, training=False).numpy() for x, _ in batches.dataset])
    served = tf.saved_model.load(str(tmp_path / "export"))
    raw = [seg_sample(s, size=24)[0] for s in (4, 5, 6)]
    exported = np.concatenate([served.serve(r[None])["logits"].numpy() for r in raw])
    assert exported.shape == evaluated.shape == (3, 16, 16, 3)
    np.testing.assert_allclose(exported, evaluated, atol=1e-5, rtol=0)
    # A second export replaces the first whole, leaving no temporary folder behind.
    export_inference(model, tmp_path / "export", inference.preprocess, inference.dtype,
                     inference.channels, {"task": inference.task, "second": True})
    assert '"second": true' in (tmp_path / "export" / "inference.json").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "export"]
