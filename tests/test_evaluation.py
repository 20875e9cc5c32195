"""Exact evaluation: sums per worker, one all-reduce, metrics equal to a NumPy computation."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

import input_pipelines
from input_pipelines.registry import Shard
from tests.conftest import TINY, read_results, requires_horovod, run_train
from tests.pipeline_data import image, write_image_folder
from tfscale.config.train_config import TrainConfig
from tfscale.training import evaluation
from tfscale.training.events import read_events
from tfscale.training.losses import build_loss
from tfscale.training.metrics import build_metrics


class Sum:
    """A stand-in for a strategy whose all-reduce adds the other workers' sums to ours."""

    def __init__(self, others: list[np.ndarray]) -> None:
        self.others = others
        self.calls = 0

    def all_reduce(self, values, op="mean"):
        assert op == "sum"
        self.calls += 1
        return np.asarray(values, np.float64) + sum(self.others)


def _log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.exp(z).sum(axis=-1, keepdims=True))


def _model(classes: int, seed: int = 0) -> keras.Model:
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((6,)), keras.layers.Dense(classes)])


def _shards(x: np.ndarray, y: np.ndarray, batch: int) -> list[tf.data.Dataset]:
    """Two workers' validation data: every other example (19 and 18 of 37), last batch
    partial, as the pipelines give it."""
    return [tf.data.Dataset.from_tensor_slices((x[i::2], y[i::2])).batch(batch)
            for i in range(2)]


@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_two_uneven_workers_equal_one_numpy_pass_over_37_examples(smoothing: float) -> None:
    classes = 10
    rng = np.random.default_rng(0)
    x = rng.normal(size=(37, 6)).astype(np.float32)
    y = rng.integers(0, classes, 37).astype(np.int32)
    model = _model(classes)
    cfg = TrainConfig(model="tiny_cnn", num_classes=classes, label_smoothing=smoothing)
    loss = build_loss(cfg, "classification")
    data = _shards(x, y, batch=8)
    second = evaluation.Evaluator(data[1], 0, loss, "classification", classes, Sum([]))
    comm = Sum([second.local_sums(model)])
    metrics, examples = evaluation.Evaluator(data[0], 0, loss, "classification", classes,
                                             comm).evaluate(model)

    logits = model.predict(x, verbose=0)
    log_p = _log_softmax(logits.astype(np.float64))
    target = (1 - smoothing) * np.eye(classes)[y] + smoothing / classes
    top5 = np.argsort(-logits, axis=1)[:, :5]
    assert examples == 37 and comm.calls == 1
    assert metrics["val_loss"] == pytest.approx(np.mean(-(target * log_p).sum(1)), rel=1e-5)
    assert metrics["val_accuracy"] == pytest.approx(np.mean(logits.argmax(1) == y))
    assert metrics["val_top5_accuracy"] == pytest.approx(np.mean((top5 == y[:, None]).any(1)))
    # The compiled loss on the whole split at once gives the same value.
    assert metrics["val_loss"] == pytest.approx(float(loss(y, logits)), rel=1e-5)


def test_max_batches_caps_each_worker_and_a_worker_without_data_adds_zeros() -> None:
    classes = 4
    rng = np.random.default_rng(1)
    x = rng.normal(size=(20, 6)).astype(np.float32)
    y = rng.integers(0, classes, 20).astype(np.int32)
    model = _model(classes)
    loss = build_loss(TrainConfig(model="tiny_cnn", num_classes=classes), "classification")
    full = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
    empty = full.take(0)
    idle = evaluation.Evaluator(empty, 0, loss, "classification", classes, Sum([]))
    assert not idle.local_sums(model).any()
    capped = evaluation.Evaluator(full, 2, loss, "classification", classes,
                                  Sum([idle.local_sums(model)]))
    metrics, examples = capped.evaluate(model)
    assert examples == 16
    assert metrics["val_accuracy"] == pytest.approx(
        np.mean(model.predict(x[:16], verbose=0).argmax(1) == y[:16]))
    assert "val_top5_accuracy" not in metrics  # 4 classes: top-5 would always be 1


def test_segmentation_iou_matches_the_training_metrics() -> None:
    classes = 4
    rng = np.random.default_rng(2)
    logits = rng.normal(size=(5, 6, 6, classes)).astype(np.float32)
    labels = rng.integers(0, 3, (5, 6, 6)).astype(np.int32)  # class 3 never a label
    logits[..., 3] -= 10.0  # ... and never predicted: absent from the mean
    cfg = TrainConfig(model="tiny_cnn", num_classes=classes)
    loss = build_loss(cfg, "segmentation")
    sums = sum(evaluation.batch_sums(logits[i:i + 2], labels[i:i + 2],
                                     loss.call(labels[i:i + 2], logits[i:i + 2]),
                                     "segmentation", classes).numpy() for i in (0, 2, 4))
    metrics = evaluation.derive(sums, "segmentation", classes)
    keras_metrics = {m.name: m for m in build_metrics(cfg, "segmentation")}
    for m in keras_metrics.values():
        m.update_state(labels, logits)
    for name in ("accuracy", "mean_iou", "iou_0", "iou_1", "iou_2", "iou_3"):
        assert metrics[f"val_{name}"] == pytest.approx(float(keras_metrics[name].result()),
                                                       abs=1e-6), name
    assert metrics["val_iou_3"] == 0.0
    assert metrics["val_loss"] == pytest.approx(float(loss(labels, logits)), rel=1e-5)


def test_no_example_gives_nan_not_an_error() -> None:
    metrics = evaluation.derive(np.zeros(evaluation.sums_size("classification", 10)),
                                "classification", 10)
    assert all(np.isnan(v) for v in metrics.values())


def write_uneven_folder(root: Path) -> None:
    """16 training images and 37 validation images (10, 9, 9, 9 per class) in 4 classes."""
    write_image_folder(root, classes=4, per_class=4, splits=("train",))
    for i in range(37):
        folder = root / "validation" / f"c{i % 4}"
        folder.mkdir(parents=True, exist_ok=True)
        (folder / f"v{i}.png").write_bytes(tf.io.encode_png(image(1000 + i)).numpy())


def numpy_metrics(model_dir: Path, data_dir: Path) -> tuple[dict[str, float], int]:
    """Loss and accuracy of model_dir's saved model over the whole validation split, read by
    one process and computed with NumPy."""
    cfg = TrainConfig(model="tiny_cnn", dataset="image_folder", data_dir=str(data_dir),
                      image_size=16, num_classes=4, batch_size=4, steps=6, epochs=2)
    batches = input_pipelines.PIPELINES.get("image_folder")(cfg, Shard(), "validation", 8)
    model = keras.models.load_model(model_dir / "model.keras")
    pairs = [(model(x, training=False).numpy(), y) for x, y in batches.dataset]
    logits = np.concatenate([p[0] for p in pairs]).astype(np.float64)
    labels = np.concatenate([p[1] for p in pairs])
    loss = -_log_softmax(logits)[np.arange(len(labels)), labels].mean()
    return {"val_loss": loss, "val_accuracy": np.mean(logits.argmax(1) == labels)}, len(labels)


@pytest.mark.slow
@requires_horovod
def test_two_workers_evaluate_37_examples_exactly_stop_at_the_target_and_eval_only_agrees(
        tmp_path: Path) -> None:
    """With batch norm (tiny_bn_cnn): the two workers evaluate with the statistics they
    recomputed together, which the checkpoint and the saved model hold, so the reported
    metrics are those of --eval_only in one process and of the saved model in NumPy (with
    each worker's own moving averages they were not)."""
    data, run = tmp_path / "data", tmp_path / "run"
    write_uneven_folder(data)
    common = [*TINY, "--model=tiny_bn_cnn", "--dataset=image_folder",
              f"--data_dir={data}", f"--model_dir={run}"]
    # Steps 0->6 in 2 epochs of 3; evaluations every 2 steps; any accuracy >= 0 meets the
    # target, so every worker must stop right after the first evaluation, at step 2.
    proc = run_train(*common, "--strategy=horovod", "--num_processes=2", "--steps=6",
                     "--epochs=2", "--eval_every=2", "--target_metric=val_accuracy:0",
                     timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = read_results(run)
    assert results["num_workers"] == 2 and results["steps"] == 2
    assert results["target"] == {**results["target"], "metric": "val_accuracy", "value": 0.0,
                                 "direction": "max", "reached": True, "step": 2,
                                 "epoch": pytest.approx(2 / 3, abs=1e-3)}
    assert results["train_seconds"] >= results["target"]["seconds"] > 0
    [record] = results["evaluations"]
    assert (record["step"], record["examples"]) == (2, 37)
    expected, examples = numpy_metrics(run, data)
    assert examples == 37
    # The same weights and statistics: equal up to float32 rounding (~1e-8 here); each
    # worker's own moving averages gave 1e-5.
    for name, value in expected.items():
        assert record["metrics"][name] == pytest.approx(value, rel=1e-6), name
        assert results["metrics"][name] == pytest.approx(value, rel=1e-6), name
    assert "target" in proc.stdout and "reached" in proc.stdout

    lines = read_events(run / "events.jsonl")
    assert [e["event"] for e in lines] == ["run_start", "eval", "target_reached", "epoch_end",
                                           "run_stop"]  # the chief's only: one run_start
    assert lines[0]["num_workers"] == 2 and lines[1]["examples"] == 37
    assert lines[2]["step"] == 2 and lines[3]["step"] == 2
    assert lines[4]["status"] == "target_reached" and lines[4]["step"] == 2
    assert [p.name for p in (run / "checkpoints").iterdir()] == ["ckpt-000000002.npz"]

    # --eval_only with only the model_dir: the model and data as trained (config.json), and
    # the evaluated model saved and exported again.
    before = (run / "results.json").read_bytes()
    assert (run / "export").is_dir()
    shutil.rmtree(run / "export")
    (run / "model.keras").unlink()
    proc = run_train("--eval_only", f"--model_dir={run}", "--tensorboard=false", timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert f"--eval_only: as {run} was trained (its config.json): " in proc.stdout
    assert f"--data_dir={data}" in proc.stdout and "--model=tiny_bn_cnn" in proc.stdout
    assert (run / "model.keras").is_file() and (run / "export").is_dir()
    report = json.loads((run / "eval.json").read_text())
    assert (report["step"], report["examples"]) == (2, 37)
    for name, value in expected.items():
        assert report["metrics"][name] == pytest.approx(value, rel=1e-6), name
    assert (run / "results.json").read_bytes() == before
    assert "evaluation of step 2 (37 examples)" in proc.stdout


def test_eval_only_without_a_checkpoint_names_the_model_dir(tmp_path: Path) -> None:
    proc = run_train(*TINY, "--validation_steps=1", "--eval_only", f"--model_dir={tmp_path}",
                     timeout=120)
    assert proc.returncode == 2
    assert f"--eval_only: no checkpoint in --model_dir={tmp_path}" in proc.stderr
    assert not (tmp_path / "eval.json").exists()
