"""Pure pieces of the trainer and results: step planning, summary, atomic JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tfscale.training.files import write_json_atomic
from tfscale.training.results import summary
from tfscale.training.trainer import Segment, plan_segments


@pytest.mark.parametrize(
    ("start", "total", "spe", "expected"),
    [
        (0, 10, 5, [Segment(0, 2, 5, 0)]),
        (0, 10, 4, [Segment(0, 2, 4, 0), Segment(2, 3, 2, 8)]),
        (3, 10, 5, [Segment(0, 1, 2, 3), Segment(1, 2, 5, 5)]),
        (7, 10, 5, [Segment(1, 2, 3, 7)]),
        (10, 10, 5, []),
        (2, 9, 3, [Segment(0, 1, 1, 2), Segment(1, 3, 3, 3)]),
    ],
)
def test_plan_segments(start: int, total: int, spe: int, expected: list[Segment]) -> None:
    segments = plan_segments(start, total, spe)
    assert segments == expected
    covered = sum((s.epochs - s.initial_epoch) * s.steps_per_epoch for s in segments)
    assert covered == total - start


def test_results_json_is_atomic_and_summary_has_figures(tmp_path: Path) -> None:
    results = {"model": "m", "strategy": "horovod", "num_workers": 2, "replicas_per_worker": 1,
               "global_batch_size": 64, "steps": 10, "steps_this_run": 10,
               "images_per_sec": 12.5, "images_per_sec_per_worker": 6.25,
               "step_time_ms": 5120.0, "final_loss": 6.9, "metrics": {"accuracy": 0.5}}
    path = tmp_path / "sub" / "results.json"
    write_json_atomic(path, results)
    assert json.loads(path.read_text()) == results
    assert [p.name for p in path.parent.iterdir()] == ["results.json"]
    text = summary(results)
    for fragment in ("horovod", "2 x 1", "64", "12.50", "6.25", "5120.0 ms", "6.9000",
                     "accuracy"):
        assert fragment in text


def test_gpu_for_local_rank() -> None:
    from tfscale.strategies.horovod import gpu_for_local_rank

    assert gpu_for_local_rank(0, 0) is None  # CPU
    assert gpu_for_local_rank(3, 1) is None  # the launcher already gave this rank one GPU
    assert gpu_for_local_rank(5, 6) == 5  # Summit node: 6 ranks, 6 GPUs
    with pytest.raises(ValueError, match="local rank 4 has no GPU of its own: this node shows 4"):
        gpu_for_local_rank(4, 4)


def test_configure_runtime_sets_tf32_and_cudnn_autotune(monkeypatch: pytest.MonkeyPatch) -> None:
    import tensorflow as tf

    from tfscale.config.train_config import TrainConfig
    from tfscale.training.trainer import configure_runtime

    monkeypatch.delenv("TF_CUDNN_USE_AUTOTUNE", raising=False)
    try:
        configure_runtime(TrainConfig(model="tiny_cnn", tf32=False, cudnn_autotune=False))
        assert not tf.config.experimental.tensor_float_32_execution_enabled()
        assert os.environ["TF_CUDNN_USE_AUTOTUNE"] == "0"
        configure_runtime(TrainConfig(model="tiny_cnn"))
        assert tf.config.experimental.tensor_float_32_execution_enabled()
        assert os.environ["TF_CUDNN_USE_AUTOTUNE"] == "1"
    finally:
        tf.config.experimental.enable_tensor_float_32_execution(True)


class _Workers:
    """The part of a Strategy that Trainer._total_steps uses, for one worker of several whose
    example counts are ``shares`` (``all_reduce`` sees every worker's value)."""

    def __init__(self, shares: list[int], rank: int) -> None:
        self.shares, self.rank = shares, rank
        self.replicas_in_process = 1

    def all_reduce(self, values: list[float], op: str = "mean") -> list[float]:
        assert op == "min"
        per_worker = [[float(s // 4), -float(s // 4)] for s in self.shares]
        return [min(column) for column in zip(*per_worker, strict=True)]


@pytest.mark.parametrize("rank", [0, 1])
def test_uneven_shards_give_every_worker_the_same_epoch(rank: int) -> None:
    """Shards of 13 and 9 examples, batches of 4: both workers take 2 steps per epoch (the
    9-example one has only 2 batches), or one would wait forever in a collective."""
    from types import SimpleNamespace

    from tfscale.config.train_config import TrainConfig
    from tfscale.training.trainer import Trainer

    trainer = Trainer.__new__(Trainer)
    trainer.config = TrainConfig(model="mlp", batch_size=4, steps=0, epochs=3,
                                 dataset="image_folder", data_dir="/data")
    trainer.strategy = _Workers([13, 9], rank)  # type: ignore[assignment]
    train = SimpleNamespace(examples=[13, 9][rank])
    assert trainer._total_steps(train) == (6, 2)  # type: ignore[arg-type]
    trainer.strategy = _Workers([13, 3], rank)  # type: ignore[assignment]
    train = SimpleNamespace(examples=[13, 3][rank])
    with pytest.raises(ValueError, match="at least one batch of 4 examples on every worker"):
        trainer._total_steps(train)  # type: ignore[arg-type]
