"""``tfscale.prepare()`` and ``tfscale.setup()`` (tfscale/scripts/prepare.py): users' scripts get
what
``tfscale.train`` gets, through the same code path.

The unit tests run in this process under the default strategy, given explicitly (no process
session). The integration test runs a user-style script under ``tfscale-run --nproc=2`` and
``tfscale.train --num_processes=2`` on the same data and flags, and compares their checkpoints.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import TINY, requires_horovod, run_process, run_train
from tfscale.cluster.shard import Shard
from tfscale.config.settings import configuration
from tfscale.config.train_config import TrainConfig
from tfscale.scripts import prepare as _prepare
from tfscale.strategies import create
from tfscale.strategies.launched import launched_strategy
from tfscale.training import features


@pytest.mark.parametrize(("environ", "expected"), [
    ({"TFSCALE_STRATEGY": "ddl", "TF_CONFIG": "{}"}, "ddl"),
    ({"TF_CONFIG": "{}"}, "multiworker"),
    ({"HOROVOD_RANK": "1", "HOROVOD_SIZE": "2", "HOROVOD_LOCAL_RANK": "1",
      "HOROVOD_LOCAL_SIZE": "2"}, "horovod"),
    ({"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1",
      "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "1"}, "default"),
    ({}, "default"),
])
def test_strategy_comes_from_the_launcher(environ: dict[str, str], expected: str) -> None:
    assert launched_strategy(environ) == expected


@pytest.fixture
def default() -> Iterator[object]:
    strategy = create(TrainConfig(model="tiny_cnn"))
    strategy.setup()
    yield strategy
    strategy.teardown()


def _model(name: str = "net", batch_norm: bool = True) -> keras.Model:
    keras.utils.set_random_seed(3)
    inputs = keras.Input((6,))
    x = keras.layers.Dense(8, name="block1_dense")(inputs)
    if batch_norm:
        x = keras.layers.BatchNormalization(name="block1_bn")(x)
    outputs = keras.layers.Dense(3, name="head")(keras.layers.ReLU(name="block1_relu")(x))
    return keras.Model(inputs, outputs, name=name)


def _block(name: str) -> str | None:
    return "block1" if name.startswith("block1") else None


def _fit(model: keras.Model, optimizer: object, callbacks: list[object]) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    x, y = rng.random((16, 6), dtype=np.float32), rng.integers(0, 3, 16)
    if not model.compiled:
        model.compile(optimizer=optimizer, loss=keras.losses.SparseCategoricalCrossentropy(
            from_logits=True))
    model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=callbacks)
    return [np.asarray(w) for w in model.get_weights()]


def test_features_applied_before_or_after_compile_train_alike(default: object,
                                                              tmp_path: Path) -> None:
    loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    before = _prepare.prepare(_model(), keras.optimizers.SGD(0.1, momentum=0.9),
                              grad_accum_steps=2, recompute=_block, sync_bn=True,
                              checkpoint_dir=str(tmp_path / "ckpt"), strategy=default)
    model, optimizer, callbacks = before
    assert "train_step" in vars(model) and "call" in vars(model)  # accumulation, recompute
    assert optimizer.built and [type(c).__name__ for c in callbacks] == [
        "TrainingGuard", "BatchNormStatistics", "Checkpoint"]
    weights_before = _fit(model, optimizer, callbacks)
    assert (tmp_path / "ckpt").is_dir() and before.resumed_step == 0

    compiled = _model()
    compiled.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss=loss)
    after = _prepare.prepare(compiled, grad_accum_steps=2, recompute=_block, sync_bn=True,
                             strategy=default)
    assert compiled.optimizer is after.optimizer
    weights_after = _fit(compiled, None, after.callbacks)
    for a, b in zip(weights_before, weights_after, strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)

    # A restarted script resumes from the chief's last checkpoint (1 step: 16 examples of 8,
    # micro-batches of 4).
    resumed = _prepare.prepare(_model(), keras.optimizers.SGD(0.1, momentum=0.9),
                               grad_accum_steps=2, recompute=_block, sync_bn=True,
                               checkpoint_dir=str(tmp_path / "ckpt"), strategy=default)
    assert resumed.resumed_step == 2
    for a, b in zip(weights_before, resumed.model.get_weights(), strict=True):
        np.testing.assert_array_equal(a, np.asarray(b))


def test_keras_sgd_takes_the_fused_update_and_nothing_else_changes(default: object) -> None:
    from tfscale.training.optimizers import SGD

    given = keras.optimizers.SGD(0.1, momentum=0.9)
    model, optimizer, _ = _prepare.prepare(_model(), given, strategy=default)
    assert given is optimizer and isinstance(optimizer, SGD)
    assert optimizer.get_config() == keras.optimizers.SGD(0.1, momentum=0.9,
                                                          name=given.name).get_config()

    class Mine(keras.optimizers.SGD):
        pass

    _, own, _ = _prepare.prepare(_model(), Mine(0.1, momentum=0.9), strategy=default)
    assert type(own) is Mine  # a user's own subclass keeps its update
    _, adam, _ = _prepare.prepare(_model(), "adam", strategy=default)
    assert not isinstance(adam, SGD)


@pytest.mark.parametrize(("options", "message"), [
    ({"gradient_lag": 1}, r"^tfscale.prepare: --gradient_lag only applies to "
                          r"--strategy=ddl or --strategy=horovod$"),
    ({"sync_bn_group": 2}, "^tfscale.prepare: --sync_bn_group=2 needs --sync_bn$"),
    ({"precision": "mixed_bfloat16"}, r"^tfscale.prepare: model 'net' was built with dtype "
                                      r"policy 'float32', precision 'mixed_bfloat16' needs "
                                      r"'mixed_bfloat16': call tfscale.setup\(precision="),
    ({"grad_accum_steps": 0}, "^tfscale.prepare: --grad_accum_steps=0 is not valid"),
])
def test_refuses_with_the_reason(default: object, options: dict[str, object],
                                 message: str) -> None:
    with pytest.raises(ValueError, match=message) as err:
        _prepare.prepare(_model(), "sgd", strategy=default, **options)  # type: ignore[arg-type]
    assert "\n" not in str(err.value)


def test_refuses_an_unbuilt_model_and_a_model_without_batch_norm(default: object) -> None:
    unbuilt = keras.Sequential([keras.layers.Dense(2)], name="lazy")
    with pytest.raises(ValueError, match="model 'lazy' has no variables yet; build it first"):
        _prepare.prepare(unbuilt, "sgd", strategy=default)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no batch-norm layers to synchronize"):
        _prepare.prepare(_model(batch_norm=False), "sgd", sync_bn=True,
                         strategy=default)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="^tfscale.setup: unknown option 'epoch'; options are"):
        _prepare.setup(epoch=3)


class _Rank:
    """A strategy stand-in that says which shard this process reads."""

    def __init__(self, index: int, count: int) -> None:
        self._shard = Shard(index, count)

    def shard(self) -> Shard:
        return self._shard

    def distribute_dataset(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        return dataset.map(lambda batch: -batch)  # marks that the strategy got the batches


def test_shards_datasets_and_arrays_evenly() -> None:
    second = _Rank(1, 2)
    data = tf.data.Dataset.range(7)
    assert list(_prepare.shard_dataset(data, strategy=second)  # type: ignore[arg-type]
                .as_numpy_iterator()) == [1, 3, 5]
    batched = _prepare.shard_dataset(data, batch_size=2, strategy=second)  # type: ignore[arg-type]
    assert [b.tolist() for b in batched.as_numpy_iterator()] == [[-1, -3]]
    x, y = _prepare.shard_arrays(np.arange(7), np.arange(7) * 10, strategy=second)  # type: ignore[arg-type]
    # 7 rows over 2 workers: the 7th is dropped, so both have 3 and take 3 steps of 1.
    assert x.tolist() == [1, 3, 5] and y.tolist() == [10, 30, 50]
    with pytest.raises(ValueError, match="different lengths \\[2, 3\\]"):
        _prepare.shard_arrays(np.arange(3), np.arange(2), strategy=second)  # type: ignore[arg-type]


def _checkpoint(directory: Path) -> dict[str, np.ndarray]:
    """The newest checkpoint's entries by variable path."""
    from tfscale.training.checkpointing import CheckpointManager

    manager = CheckpointManager(directory)
    meta, arrays = manager.read(manager.steps()[0])
    return dict(zip(meta["paths"], arrays, strict=True))


@pytest.mark.slow
@requires_horovod
@pytest.mark.parametrize(("strategy", "lag"), [("horovod", 1), ("multiworker", 0)])
def test_user_script_under_tfscale_run_equals_tfscale_train(strategy: str, lag: int,
                                                            tmp_path: Path) -> None:
    """2 workers, 3 steps of 2 micro-batches of 2 (Horovod: with the gradient lag): the
    script's checkpoint (weights, momentum, pending gradients) equals tfscale.train's, and its
    workers' weights are identical. The script's data is one stream that shard_dataset shards,
    batches and (multiworker) marks as each worker's own. (Synchronized batch norm and
    recomputation take the same path; their equivalence is in
    test_features_applied_before_or_after_compile_train_alike and their own tests.)"""
    features = ["--grad_accum_steps=2", f"--gradient_lag={lag}"]
    trained = run_train(*TINY, "--batch_size=2", "--steps=3", "--learning_rate=0.1",
                        f"--strategy={strategy}", "--num_processes=2",
                        f"--model_dir={tmp_path / 'train'}", *features, timeout=300)
    assert trained.returncode == 0, trained.stdout[-3000:] + trained.stderr[-3000:]
    out = tmp_path / "script"
    out.mkdir()
    script = run_process([sys.executable, "-m", "tfscale.run", "--nproc=2",
                          f"--strategy={strategy}", "-m", "tests.workers.prepare_script",
                          f"--out={out}", "--steps=3", "--batch=2", f"--gradient_lag={lag}"],
                         timeout=300)
    assert script.returncode == 0, script.stdout[-3000:] + script.stderr[-3000:]

    ranks = [np.load(out / f"rank{r}.npz") for r in range(2)]
    for name in ranks[0].files:
        np.testing.assert_array_equal(ranks[0][name], ranks[1][name])
    assert json.loads((out / "rank0.json").read_text())["size"] == 2
    mine, theirs = _checkpoint(out / "checkpoints"), _checkpoint(tmp_path / "train" / "checkpoints")
    shared = sorted(set(mine) & set(theirs))
    # Every weight, its momentum and (lag) its pending gradient; the learning rate is a
    # schedule in tfscale.train, a variable in the script.
    assert len(shared) >= (2 + lag) * len(ranks[0].files), (sorted(mine), sorted(theirs))
    worst = max(float(np.max(np.abs(mine[p] - theirs[p]))) for p in shared)
    assert worst < 1e-5, worst


def test_a_script_sets_up_once_and_prepare_uses_that_strategy() -> None:
    try:
        strategy = _prepare.setup(seed=5, sync_bn=True)
        assert configuration(strategy.config).seed == 5 and strategy.config.sync_bn
        prepared = _prepare.prepare(_model(), "sgd")
        assert prepared.strategy is strategy and _prepare.setup() is strategy
        assert _prepare.shard_arrays(np.arange(3))[0].tolist() == [0, 1, 2]
        with pytest.raises(ValueError, match="^tfscale.setup: already set up with other "):
            _prepare.setup(seed=6)
    finally:
        _prepare._close()


def test_refuses_a_model_built_outside_a_tf_distribute_scope() -> None:
    class TwoReplicas:
        num_replicas_in_sync = 2

    class Stub:
        tf_strategy = TwoReplicas()

    config = TrainConfig(model="net", strategy="multiworker")
    with pytest.raises(ValueError, match=r"^tfscale.prepare: model 'net' was built outside "
                       r"--strategy=multiworker's scope: call tfscale.setup\(\) before"):
        features._check_model(_model(), config, Stub())  # type: ignore[arg-type]
