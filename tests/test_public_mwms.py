"""``tfscale.multiworker``: Keras 3 ``model.fit`` under MultiWorkerMirroredStrategy in users'
own scripts.

In-process: the Keras version check, switching the fix on and off, and that other strategies
go through Keras's own code. With two real TF_CONFIG workers on loopback: Keras alone fails
(the upstream bug the fix exists for); with the fix the workers end with identical weights,
a falling loss, the same averaged logs, and a model plain Keras loads.
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras.src.backend.tensorflow import trainer as tf_trainer

import tfscale.multiworker as mwms
from tests.equivalence import load_weights, max_abs_diff
from tfscale.scripts.launcher import supervise, tf_config_envs
from tfscale.strategies.multiworker import MultiWorkerStrategy

WORKER = [sys.executable, "-m", "tests.workers.mwms_fit"]


# --- in-process -------------------------------------------------------------------------------

def test_untested_keras_version_is_refused_with_what_to_do(monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setattr(keras, "__version__", "3.16.0")
    with pytest.raises(RuntimeError, match=r"made for Keras 3\.15\.x; this environment has Keras "
                                           r"3\.16\.0.*pip install 'keras>=3\.15,<3\.16'"):
        mwms.enable()
    assert not mwms.is_enabled()
    with pytest.raises(ValueError, match="Keras 3.16.0"):
        MultiWorkerStrategy.check_environment()


def test_enable_is_idempotent_and_disable_restores_keras() -> None:
    original_build = tf_trainer.TensorFlowTrainer._maybe_symbolic_build
    original_reduce = tf_trainer.reduce_per_replica
    original_iterator = tf_trainer.TFEpochIterator.__init__
    assert not mwms.is_enabled()
    with mwms.enabled():
        mwms.enable()
        assert tf_trainer.reduce_per_replica is not original_reduce
        assert tf_trainer.TensorFlowTrainer._maybe_symbolic_build is not original_build
    assert tf_trainer.reduce_per_replica is original_reduce
    assert tf_trainer.TensorFlowTrainer._maybe_symbolic_build is original_build
    assert tf_trainer.TFEpochIterator.__init__ is original_iterator
    mwms.enable()
    with mwms.enabled():
        pass
    assert mwms.is_enabled(), "a context must leave an earlier enable() in place"
    mwms.disable()
    assert tf_trainer.reduce_per_replica is original_reduce


def test_other_strategies_train_unchanged_with_the_fix_on() -> None:
    x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    results: list[Any] = []
    for use_fix in (False, True):
        for strategy in (None, tf.distribute.MirroredStrategy(["/cpu:0"])):
            keras.utils.set_random_seed(0)
            scope = strategy.scope() if strategy else contextlib.nullcontext()
            with scope:
                model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
                model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
            if use_fix:
                mwms.enable()
            try:
                history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, shuffle=False)
            finally:
                mwms.disable()
            results.append((history.history["loss"], model.get_weights()))
    for (loss_off, w_off), (loss_on, w_on) in zip(results[:2], results[2:], strict=True):
        assert loss_off == loss_on
        assert max_abs_diff(w_off, w_on) == 0.0


def test_a_per_worker_dataset_is_iterated_as_it_is_by_one_cpu_replica() -> None:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    marked = mwms.per_worker_dataset(tf.data.Dataset.range(8).batch(2))
    plain = tf.data.Dataset.range(8).batch(2)
    with mwms.enabled():
        iterators = [tf_trainer.TFEpochIterator(distribute_strategy=strategy, x=ds,
                                                steps_per_epoch=2) for ds in (marked, plain)]
    # The marked dataset is not wrapped in a distributed one (whose iterator cost 7% of an
    # mlp step); an unmarked one still is, as Keras does.
    assert iterators[0]._distributed_dataset is marked
    assert isinstance(iterators[1]._distributed_dataset, tf.distribute.DistributedDataset)
    batches = [next(iter(it._distributed_dataset)) for it in iterators]
    local = strategy.experimental_local_results(batches[1])[0]
    assert [int(v) for v in batches[0]] == [0, 1] == [int(v) for v in local]


# --- two TF_CONFIG workers --------------------------------------------------------------------

def _workers(out: Path, *flags: str) -> tuple[int, str]:
    log = io.StringIO()
    code = supervise([*WORKER, f"--out={out}", *flags], tf_config_envs(2), out=log)
    return code, log.getvalue()


@pytest.mark.slow
def test_keras_alone_fails_under_multiworker_strategy(tmp_path: Path) -> None:
    code, log = _workers(tmp_path, "--no-fix")
    assert code != 0
    assert "PerReplica" in log, log[-3000:]


@pytest.mark.slow
@pytest.mark.parametrize("data", ["global", "per-worker"])
def test_fit_under_multiworker_strategy_keeps_workers_identical(tmp_path: Path,
                                                                data: str) -> None:
    code, log = _workers(tmp_path, *(["--per-worker"] if data == "per-worker" else []))
    assert code == 0, log[-3000:]
    weights = [load_weights(tmp_path / f"rank{r}.npz") for r in range(2)]
    assert max_abs_diff(weights[0], weights[1]) == 0.0
    logs = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    losses = logs[0]["history"]["loss"]
    assert losses[-1] < 0.8 * losses[0], losses
    # Logs are the mean over both workers' replicas, so they are the same on each worker.
    assert logs[0] == logs[1]
    loaded = keras.models.load_model(tmp_path / "model.keras")
    assert type(loaded.optimizer) is keras.optimizers.SGD
    assert max_abs_diff(loaded.get_weights(), weights[0]) == 0.0
