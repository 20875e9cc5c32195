"""--target_metric parsing and checks, the reported metrics, and the target/evaluation
callbacks in one process."""

from __future__ import annotations

import json
import math
from pathlib import Path

import keras
import numpy as np
import pytest

from input_pipelines import has_validation_split
from tests.conftest import TINY, run_train
from tfscale.callbacks import Evaluation, TargetStop
from tfscale.config import targets
from tfscale.config.train_config import TrainConfig
from tfscale.training import events


def test_parse_directions_and_defaults() -> None:
    assert targets.parse_target("") is None
    assert targets.parse_target("val_accuracy:0.95") == targets.Target("val_accuracy", 0.95,
                                                                       "max")
    assert targets.parse_target("val_loss:0.3").direction == "min"
    assert targets.parse_target("val_loss:0.3:max").direction == "max"
    low = targets.parse_target("mean_iou:0.5:min")
    assert low is not None and low.reached(0.4) and not low.reached(0.6)
    assert not low.reached(math.nan)


@pytest.mark.parametrize("text, message", [
    ("val_accuracy", "expected NAME:VALUE"),
    ("val_accuracy:high", "'high' is not a number"),
    ("val_accuracy:0.9:up", "direction 'up' is not valid; choose one of: min, max"),
])
def test_malformed_targets_fail_in_the_config(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        TrainConfig(target_metric=text)


def test_reported_metrics() -> None:
    assert targets.reported_metrics("classification", 4, False) == ["loss", "accuracy"]
    assert targets.reported_metrics("classification", 10, True) == [
        "loss", "accuracy", "val_loss", "val_accuracy", "val_top5_accuracy"]
    seg = targets.reported_metrics("segmentation", 2, True)
    assert seg == ["loss", "accuracy", "mean_iou", "iou_0", "iou_1", "val_loss", "val_accuracy",
                   "val_mean_iou", "val_iou_0", "val_iou_1"]


def test_evaluation_is_on_with_validation_steps_or_a_validation_split(tmp_path: Path) -> None:
    assert not has_validation_split(str(tmp_path))
    assert not targets.evaluation_enabled(TrainConfig(data_dir=str(tmp_path)), False)
    assert targets.evaluation_enabled(TrainConfig(validation_steps=2), False)
    (tmp_path / "validation").mkdir()
    assert has_validation_split(str(tmp_path))
    assert targets.evaluation_enabled(TrainConfig(data_dir=str(tmp_path)), True)
    with pytest.raises(ValueError, match="--eval_every needs validation data"):
        targets.check_evaluation(TrainConfig(eval_every=5), "classification", False)


def test_a_bad_metric_name_fails_at_start_with_one_line_listing_the_metrics(
        tmp_path: Path) -> None:
    proc = run_train(*TINY, "--steps=2", "--target_metric=val_acc:0.9",
                     f"--model_dir={tmp_path}", timeout=120)
    assert proc.returncode == 2
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert lines == ["error: --target_metric='val_acc:0.9': 'val_acc' is not reported (val_ "
                     "metrics need validation data); choose one of: loss, accuracy"]
    assert not (tmp_path / "events.jsonl").exists()


class Comm:
    """One worker of two; the other one's verdicts are scripted."""

    size = 2

    def __init__(self, other_verdicts: list[float]) -> None:
        self.other = other_verdicts

    def all_reduce(self, values, op="mean"):
        assert op == "max"
        return np.maximum(np.asarray(values, np.float64), [self.other.pop(0)])


def _model() -> keras.Model:
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse")
    model.optimizer.build(model.trainable_variables)
    return model


def test_the_target_stops_when_any_worker_sees_it_and_records_the_step() -> None:
    model = _model()
    log = []
    stop = TargetStop(targets.Target("val_accuracy", 0.5, "max"), Comm([0.0, 1.0]), 0.0,
                      [log.append])
    stop.set_model(model)
    model.optimizer.iterations.assign(4)
    assert not stop.check({"val_accuracy": 0.1}, 0.5) and not model.stop_training
    model.optimizer.iterations.assign(6)
    assert stop.check({"val_accuracy": 0.2}, 0.75)  # reached on the other worker
    assert model.stop_training
    assert log == [stop.result] and stop.result is not None
    assert (stop.result["step"], stop.result["epoch"], stop.result["achieved"]) == (6, 0.75, 0.2)


def test_evaluation_runs_every_n_steps_once_per_step_and_fills_the_epoch_logs() -> None:
    model = _model()
    seen = []
    calls = []

    def evaluate(m: keras.Model) -> tuple[dict[str, float], int]:
        calls.append(int(m.optimizer.iterations.numpy()))
        return {"val_accuracy": 0.25 * len(calls)}, 37

    callback = Evaluation(evaluate, every=2, steps_per_epoch=4, start_time=0.0,
                          listeners=[seen.append])
    callback.set_model(model)
    for step in range(1, 5):
        model.optimizer.iterations.assign(step)
        callback.on_train_batch_end(step - 1, {})
    logs: dict[str, float] = {"loss": 1.0}
    callback.on_epoch_end(0, logs)  # step 4 was evaluated already
    assert calls == [2, 4]
    assert logs == {"loss": 1.0, "val_accuracy": 0.5}
    assert [(r["step"], r["epoch"], r["examples"]) for r in seen] == [(2, 0.5, 37), (4, 1.0, 37)]
    assert seen == callback.records


def test_event_log_appends_json_lines(tmp_path: Path) -> None:
    log = events.EventLog(tmp_path / "events.jsonl")
    log.emit("run_start", model="m")
    events.EventLog(tmp_path / "events.jsonl").emit("run_stop", status="success", step=3)
    lines = (tmp_path / "events.jsonl").read_text().splitlines()
    assert [json.loads(line)["event"] for line in lines] == ["run_start", "run_stop"]
    assert events.read_events(tmp_path / "events.jsonl")[1]["step"] == 3


def test_evaluation_summaries_write_scalars_at_the_step(tmp_path: Path) -> None:
    import tensorflow as tf

    from tfscale.training.evaluation import EvaluationSummaries

    write = EvaluationSummaries(tmp_path)
    write({"step": 7, "epoch": 0.5, "seconds": 1.0, "examples": 37,
           "metrics": {"val_accuracy": 0.25}})
    found = {}
    for path in tmp_path.iterdir():
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                found[value.tag] = (event.step, float(tf.make_ndarray(value.tensor)))
    assert found == {"val_accuracy": (7, 0.25), "examples": (7, 37.0)}


def test_throughput_leaves_evaluations_out(monkeypatch: pytest.MonkeyPatch) -> None:
    from tfscale.callbacks import ThroughputMeter, throughput

    clock = iter([10.0, 10.5, 13.5])
    monkeypatch.setattr(throughput.time, "perf_counter", lambda: next(clock))
    meter = ThroughputMeter(global_batch=8)
    meter.on_train_begin()
    meter.on_train_batch_end(0)  # t = 10.0
    meter.on_train_batch_end(1)  # t = 10.5: a 0.5 s step
    meter.exclude(2.5)  # an evaluation between steps 2 and 3
    meter.on_train_batch_end(2)  # t = 13.5: 3 s, of which 0.5 s training
    assert meter.step_time_ms == pytest.approx(500.0)
