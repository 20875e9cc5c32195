"""Segmentation through ``python -m tfscale.train``: class weights, IoU in results, strategies."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from tests.conftest import read_results, requires_horovod, run_process, run_train

SEG = [
    "--model=tiramisu_tiny",
    "--dataset=synthetic_seg",
    "--image_size=32",
    "--input_channels=16",
    "--num_classes=3",
    "--batch_size=2",
    "--log_every=1",
    "--tensorboard=false",
]


def _weights_file(tmp_path: Path) -> Path:
    out = tmp_path / "weights.json"
    proc = run_process(
        [
            sys.executable,
            "-m",
            "input_pipelines.tools.class_weights",
            "--dataset=synthetic_seg",
            "--image_size=32",
            "--input_channels=16",
            "--num_classes=3",
            "--samples=8",
            "--method=deepcam",
            f"--out={out}",
        ]
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def _check_metrics(results: dict[str, object], prefixes: tuple[str, ...] = ("",)) -> None:
    metrics = results["metrics"]
    assert isinstance(metrics, dict)
    for prefix in prefixes:
        names = [f"{prefix}{n}" for n in ("iou_0", "iou_1", "iou_2", "mean_iou", "loss")]
        for name in names:
            assert math.isfinite(metrics[name]), (name, metrics)
        assert 0 <= metrics[f"{prefix}mean_iou"] <= 1


def test_mirrored_mixed_precision_with_a_weights_file(tmp_path: Path) -> None:
    weights = _weights_file(tmp_path)
    assert json.loads(weights.read_text())["class_weights"][0] < 1
    model_dir = tmp_path / "run"
    proc = run_train(
        *SEG,
        "--steps=3",
        "--strategy=mirrored",
        "--cpu_replicas=2",
        "--precision=mixed_float16",
        f"--class_weights={weights}",
        "--validation_steps=1",
        f"--model_dir={model_dir}",
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = read_results(model_dir)
    assert results["config"]["class_weights"] == str(weights)
    _check_metrics(results, ("", "val_"))


def test_bad_class_weights_stop_the_run_naming_them(tmp_path: Path) -> None:
    proc = run_train(*SEG, "--steps=2", "--class_weights=1,-2,1", f"--model_dir={tmp_path}")
    assert proc.returncode != 0
    assert "--class_weights='1,-2,1': weight -2.0 of class 1" in proc.stderr
    assert not (tmp_path / "results.json").exists()


@pytest.mark.slow
@requires_horovod
def test_horovod_two_workers_with_class_weights(tmp_path: Path) -> None:
    proc = run_train(
        *SEG,
        "--steps=3",
        "--strategy=horovod",
        "--num_processes=2",
        "--precision=mixed_float16",
        "--class_weights=0.2,3,3",
        "--validation_steps=2",
        f"--model_dir={tmp_path}",
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    results = read_results(tmp_path)
    assert results["num_workers"] == 2
    _check_metrics(results, ("", "val_"))
    # 2 workers x 2 batches of 2 samples, through one summed confusion matrix.
    assert [e["examples"] for e in results["evaluations"]] == [8]
