"""Gradient accumulation (``--grad_accum_steps``): bookkeeping, one process, real workers.

The equivalence runs check both halves of the feature: the weights after K micro-batches of B
on 2 workers equal one step of the combined batch in one process, and the workers really ran
K forward passes of B per step with one gradient all-reduce (without accumulation a step is
one forward pass of K x B, which would give the same weights on this model).
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from input_pipelines import Batches
from models.small import tiny_cnn
from tests.conftest import horovodrun, requires_horovod, run_process
from tests.equivalence import WORKER, assert_replicas_equal, load_weights, max_abs_diff, reference
from tests.workers.equivalence import Counts
from tfscale.cli import plugins
from tfscale.config.train_config import TrainConfig
from tfscale.scripts.launcher import supervise, tf_config_envs
from tfscale.strategies.default import DefaultStrategy
from tfscale.training.optimizers import WarmupDecay, accumulate_gradients, scaled_learning_rate
from tfscale.training.results import describe_batch
from tfscale.training.trainer import Trainer

MICRO, BATCH, STEPS = 4, 2, 2  # 2 workers x 4 micro-batches x 2 = one step of 16


def test_flag_is_validated() -> None:
    with pytest.raises(ValueError, match=r"--grad_accum_steps=0 is not valid; expected a value"):
        TrainConfig(grad_accum_steps=0)


def test_linear_scaling_uses_the_global_batch() -> None:
    cfg = TrainConfig(learning_rate=0.1, lr_scaling="linear", grad_accum_steps=4)
    assert scaled_learning_rate(cfg, 2) == pytest.approx(0.8)
    assert scaled_learning_rate(cfg.replace(lr_scaling="none"), 2) == pytest.approx(0.1)


def test_trainer_counts_examples_per_optimizer_step(tmp_path: Path) -> None:
    cfg = TrainConfig(model="tiny_cnn", batch_size=4, grad_accum_steps=3, steps=0,
                      dataset="imagenet", epochs=2, model_dir=str(tmp_path))
    trainer = Trainer(cfg, DefaultStrategy(cfg), plugins.parts(cfg))
    assert trainer.global_batch == 12
    assert trainer._process_batch("train") == 12 and trainer._process_batch("validation") == 4
    # --steps=0: two passes over 100 examples in steps of 12 (3 micro-batches of 4).
    assert trainer._total_steps(Batches(tf.data.Dataset.range(1), 100)) == (16, 8)
    assert describe_batch({"global_batch_size": 12, "grad_accum_steps": 3}) == (
        "12 (3 micro-batches per optimizer step)")
    assert describe_batch({"global_batch_size": 12}) == "12"


def _train(micro_batches: int, steps: int, counts: Counts | None = None) -> keras.Model:
    """tiny_cnn after ``steps`` optimizer steps on batches of 8, with a learning rate that
    changes every step (warmup, then cosine decay)."""
    rng = np.random.default_rng(7)
    x = rng.random((steps * 8, 8, 8, 3), dtype=np.float32)
    y = rng.integers(0, 3, steps * 8).astype(np.int32)
    keras.utils.set_random_seed(3)
    model = tiny_cnn((8, 8, 3), 3)
    model.compile(optimizer=keras.optimizers.SGD(WarmupDecay(0.5, 2, steps, "cosine")),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    accumulate_gradients(model, micro_batches)
    if counts is not None:
        counts.count_forward(model)
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
    return model


def test_micro_batches_equal_one_large_batch_and_count_optimizer_steps() -> None:
    counts = Counts()
    accumulated = _train(MICRO, steps=3, counts=counts)
    plain = _train(1, steps=3)
    # Equal weights under a step-dependent learning rate: the schedule saw optimizer steps.
    assert max_abs_diff(accumulated.get_weights(), plain.get_weights()) < 1e-5
    assert int(accumulated.optimizer.iterations.numpy()) == 3
    assert counts.to_dict() == {"forward_passes": 12, "largest_forward_batch": 2,
                                "allreduces": 0, "sharded": 0, "exchange_divisors": [],
                                "horovod_ops": []}


def test_rejects_fewer_than_one_micro_batch() -> None:
    with pytest.raises(ValueError, match="micro_batches=0"):
        accumulate_gradients(tiny_cnn((8, 8, 3), 3), 0)


@pytest.fixture(scope="module")
def combined(tmp_path_factory: pytest.TempPathFactory) -> list[np.ndarray]:
    """One process, one step per step of the job's combined batch."""
    return reference(tmp_path_factory.mktemp("ref"), batch=2 * MICRO * BATCH, steps=STEPS)


def _worker_flags(out: Path) -> list[str]:
    return [f"--batch={BATCH}", f"--grad_accum_steps={MICRO}", f"--steps={STEPS}",
            f"--out={out}"]


def _check(out: Path, combined: list[np.ndarray]) -> dict[str, int]:
    assert max_abs_diff(assert_replicas_equal(out, 2), combined) < 1e-5
    counts = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    assert counts[0] == counts[1]
    assert counts[0]["forward_passes"] == STEPS * MICRO
    assert counts[0]["largest_forward_batch"] == BATCH
    return counts[0]


@pytest.mark.slow
@requires_horovod
def test_horovod_two_workers_equal_one_process(tmp_path: Path,
                                               combined: list[np.ndarray]) -> None:
    proc = run_process([horovodrun(), "--gloo", "-np", "2", "-H", "localhost:2", *WORKER,
                        "--strategy=horovod", *_worker_flags(tmp_path)], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    counts = _check(tmp_path, combined)
    assert counts["allreduces"] == STEPS, "one gradient all-reduce per optimizer step"
    assert "gradients inside a node: shared memory" in counts["describe"]


@pytest.mark.slow
def test_multiworker_two_workers_equal_one_process(tmp_path: Path,
                                                   combined: list[np.ndarray]) -> None:
    log = io.StringIO()
    code = supervise([*WORKER, "--strategy=multiworker", *_worker_flags(tmp_path)],
                     tf_config_envs(2), out=log)
    assert code == 0, log.getvalue()[-3000:]
    counts = _check(tmp_path, combined)
    # The logged scalars of a step stay the worker's own (the epoch's are averaged by a
    # callback), so a step exchanges its gradients only.
    assert counts["allreduces"] == STEPS, "one gradient all-reduce per optimizer step"
    assert "gradients inside a node: shared memory" in counts["describe"]


@pytest.mark.slow
def test_mirrored_two_replicas_equal_one_process(tmp_path: Path,
                                                 combined: list[np.ndarray]) -> None:
    # Keras splits the process's batch between the replicas, then each replica's batch into
    # micro-batches: 2 replicas x 4 micro-batches x 2 steps forward passes of 2.
    proc = run_process([*WORKER, "--strategy=mirrored", "--cpu_replicas=2",
                        *_worker_flags(tmp_path)], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert max_abs_diff(load_weights(tmp_path / "rank0.npz"), combined) < 1e-5
    counts = json.loads((tmp_path / "rank0.json").read_text())
    assert counts["forward_passes"] == 2 * STEPS * MICRO
    assert counts["largest_forward_batch"] == BATCH
