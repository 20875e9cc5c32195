"""Weighted cross-entropy, IoU metrics and class weights against NumPy references."""

from __future__ import annotations

import json
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from input_pipelines.tools import class_weights
from tfscale.config.train_config import TrainConfig
from tfscale.training.class_weights import parse_class_weights, weights_from_counts
from tfscale.training.losses import WeightedCrossEntropy, build_loss
from tfscale.training.metrics import build_metrics


def _reference_loss(
    logits: np.ndarray, labels: np.ndarray, weights: np.ndarray, smoothing: float = 0.0
) -> float:
    """Mean over pixels of w[y] * cross-entropy, in float64."""
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
    classes = logits.shape[-1]
    targets = np.eye(classes)[labels] * (1 - smoothing) + smoothing / classes
    terms = -(targets * log_probs).sum(axis=-1) * weights[labels]
    return float(terms.mean())


def _random_case(seed: int, shape: tuple[int, ...] = (2, 5, 7), classes: int = 4):  # type: ignore[no-untyped-def]
    rng = np.random.default_rng(seed)
    logits = rng.normal(scale=3.0, size=(*shape, classes)).astype(np.float32)
    labels = rng.integers(0, classes, size=shape).astype(np.int32)
    weights = rng.uniform(0.0, 5.0, size=classes)
    return logits, labels, weights


def _config(**changes: object) -> TrainConfig:
    return TrainConfig(**{"dataset": "synthetic_seg", "num_classes": 4, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_weighted_loss_matches_numpy(seed: int) -> None:
    logits, labels, weights = _random_case(seed)
    text = ",".join(repr(float(w)) for w in weights)
    loss = build_loss(_config(class_weights=text), "segmentation")
    assert float(loss(labels, logits)) == pytest.approx(
        _reference_loss(logits, labels, weights), rel=1e-5
    )


def test_weighted_loss_with_label_smoothing_matches_numpy() -> None:
    logits, labels, weights = _random_case(3, shape=(6,))
    loss = WeightedCrossEntropy(4, weights.tolist(), label_smoothing=0.1)
    assert float(loss(labels, logits)) == pytest.approx(
        _reference_loss(logits, labels, weights, 0.1), rel=1e-5
    )


def test_unweighted_loss_is_plain_cross_entropy() -> None:
    logits, labels, _ = _random_case(4)
    loss = build_loss(_config(), "segmentation")
    assert float(loss(labels, logits)) == pytest.approx(
        _reference_loss(logits, labels, np.ones(4)), rel=1e-5
    )
    ones = WeightedCrossEntropy(4, [1.0] * 4)
    assert float(ones(labels, logits)) == pytest.approx(float(loss(labels, logits)), rel=1e-6)


def test_zero_weight_class_contributes_nothing() -> None:
    logits, labels, weights = _random_case(5)
    weights[2] = 0.0
    loss = WeightedCrossEntropy(4, weights.tolist())
    changed = logits.copy()
    changed[labels == 2] = np.random.default_rng(9).normal(scale=50, size=(4,))
    assert np.any(labels == 2)
    assert float(loss(labels, changed)) == pytest.approx(float(loss(labels, logits)), rel=1e-6)
    with tf.GradientTape() as tape:
        variable = tf.constant(logits)
        tape.watch(variable)
        value = loss(labels, variable)
    assert not np.any(tape.gradient(value, variable).numpy()[labels == 2])


def test_loss_is_float32_for_float16_logits() -> None:
    logits, labels, weights = _random_case(6)
    loss = WeightedCrossEntropy(4, weights.tolist())
    value = loss(labels, tf.constant(logits, tf.float16))
    assert value.dtype == tf.float32
    expected = _reference_loss(logits.astype(np.float16).astype(np.float32), labels, weights)
    assert float(value) == pytest.approx(expected, rel=1e-5)


def test_class_weights_apply_to_classification_too() -> None:
    logits, labels, weights = _random_case(7, shape=(8,))
    text = ",".join(repr(float(w)) for w in weights)
    loss = build_loss(_config(class_weights=text), "classification")
    assert float(loss(labels, logits)) == pytest.approx(
        _reference_loss(logits, labels, weights), rel=1e-5
    )


def test_loss_survives_a_keras_round_trip() -> None:
    loss = WeightedCrossEntropy(3, [0.5, 1.0, 2.0], label_smoothing=0.05)
    again = keras.losses.deserialize(keras.losses.serialize(loss))
    assert (again.class_weights, again.label_smoothing) == ([0.5, 1.0, 2.0], 0.05)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1,-2,1,1", "-2.0 of class 1 is not valid"),
        ("1,2,3", "has 3 weights .* --num_classes=4"),
        ("1,nan,1,1", "nan of class 1"),
        ("0,0,0,0", "all weights are 0"),
        ("1,x,1,1", "'x' is not a number"),
        ("missing_weights.json", "'missing_weights.json' cannot be read"),
    ],
)
def test_invalid_weights_name_the_value(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build_loss(_config(class_weights=text), "segmentation")


def test_weights_from_json_files(tmp_path: Path) -> None:
    listed = tmp_path / "list.json"
    listed.write_text("[0.5, 1, 2, 4]")
    assert parse_class_weights(str(listed), 4) == (0.5, 1.0, 2.0, 4.0)
    tool = tmp_path / "tool.json"
    tool.write_text(json.dumps({"class_weights": [1, 1, 3, 0], "method": "deepcam"}))
    assert parse_class_weights(str(tool), 4) == (1.0, 1.0, 3.0, 0.0)
    for content, message in (
        ("{not json", "not valid JSON"),
        ('{"weights": [1]}', "neither"),
        ("[1, true, 1, 1]", "True of class 1 is not a number"),
    ):
        bad = tmp_path / "bad.json"
        bad.write_text(content)
        with pytest.raises(ValueError, match=message):
            parse_class_weights(str(bad), 4)
    folder = tmp_path / "folder.json"
    folder.mkdir()
    with pytest.raises(ValueError, match="folder.json' cannot be read"):
        parse_class_weights(str(folder), 4)
    assert parse_class_weights("  ", 4) is None


def test_weights_from_counts_per_method() -> None:
    counts = [900, 90, 10]
    frequencies = np.array(counts) / 1000
    for method, exponent in (("inverse", 1.0), ("inverse_sqrt", 0.5), ("deepcam", 0.125)):
        weights = np.array(weights_from_counts(counts, method))
        raw = frequencies**-exponent
        assert np.allclose(weights, raw / np.sum(frequencies * raw)), method
        assert np.sum(frequencies * weights) == pytest.approx(1.0)
    assert weights_from_counts([50, 50, 0], "inverse") == pytest.approx([1.0, 1.0, 1.0])
    with pytest.raises(ValueError, match="'median'"):
        weights_from_counts(counts, "median")
    with pytest.raises(ValueError, match="empty"):
        weights_from_counts([0, 0], "inverse")


def test_class_weights_tool_scans_the_pipeline(tmp_path: Path) -> None:
    out = tmp_path / "weights.json"
    args = [
        "--dataset=synthetic_seg",
        "--image_size=32",
        "--input_channels=4",
        "--num_classes=3",
        "--samples=16",
        "--method=inverse_sqrt",
        f"--out={out}",
    ]
    assert class_weights.main(args) == 0
    document = json.loads(out.read_text())
    assert document["samples"] == 16 and sum(document["pixels"]) == 16 * 32 * 32
    frequencies = np.array(document["frequencies"])
    assert frequencies[0] > 0.9 and np.all(frequencies[1:] < 0.06)
    assert document["class_weights"] == pytest.approx(
        weights_from_counts(document["pixels"], "inverse_sqrt")
    )
    weights = parse_class_weights(str(out), 3)
    assert weights is not None and weights[0] < 1 < weights[1]
    assert class_weights.main([*args[:-2], "--samples=0", f"--out={out}"]) == 2


def test_iou_metrics_match_numpy() -> None:
    rng = np.random.default_rng(11)
    labels = rng.integers(0, 3, size=(2, 6, 6))
    labels[labels == 2] = 1  # class 2 absent from the labels ...
    logits = rng.normal(size=(2, 6, 6, 3)).astype(np.float32)
    predictions = logits.argmax(-1)
    metrics = {m.name: m for m in build_metrics(_config(num_classes=3), "segmentation")}
    assert set(metrics) == {"accuracy", "iou_0", "iou_1", "iou_2", "mean_iou"}
    for metric in metrics.values():
        metric.update_state(labels, logits)
    ious = []
    for c in range(3):
        union = np.sum((labels == c) | (predictions == c))
        ious.append(np.sum((labels == c) & (predictions == c)) / union)
        assert float(metrics[f"iou_{c}"].result()) == pytest.approx(ious[c], rel=1e-6)
    assert np.sum(predictions == 2) > 0  # ... but predicted, so it counts in the mean
    assert float(metrics["mean_iou"].result()) == pytest.approx(np.mean(ious), rel=1e-6)
    assert float(metrics["accuracy"].result()) == pytest.approx(np.mean(predictions == labels))
