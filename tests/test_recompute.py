"""Activation recomputation (``--recompute``, :mod:`tfscale.training.recompute`).

Recomputation must change nothing but memory: the gradients, the batch-norm moving statistics
and the dropout seed states after a step equal those without it, and the recomputation really
runs (each block executes twice per training pass, counted by the graph itself).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf
from keras import layers

import models
from tests.conftest import read_results, requires_horovod, run_train
from tfscale.config.train_config import TrainConfig
from tfscale.training.optimizers import accumulate_gradients
from tfscale.training.recompute import recompute_blocks

SIZES = {"resnet50_tiny": 32, "deeplabv3plus_tiny": 32, "tiramisu_tiny": 16}


def _build(name: str, channels: int = 3) -> keras.Model:
    keras.utils.set_random_seed(7)
    config = TrainConfig(model=name, image_size=SIZES[name], input_channels=channels,
                         num_classes=3)
    return models.MODELS.get(name)(config)


def _count_block_runs(model: keras.Model, rule: Callable[[str], str | None]) -> tf.Variable:
    """A counter that the first layer of every block increments each time it runs (a plain
    ``tf.Variable``, which no ``keras.StatelessScope`` holds back)."""
    count = tf.Variable(0, dtype=tf.int64, trainable=False)
    firsts: dict[str, keras.Layer] = {}
    for layer in model.layers:
        block = rule(layer.name)
        if block is not None:
            firsts.setdefault(block, layer)
    for layer in firsts.values():
        def counted(*args: Any, _call: Any = layer.call, **kwargs: Any) -> Any:
            count.assign_add(1)
            return _call(*args, **kwargs)

        layer.call = counted
    return count


def _state(model: keras.Model) -> list[np.ndarray]:
    return [v.numpy().copy() for v in model.non_trainable_variables]


def _restore(model: keras.Model, state: Sequence[np.ndarray]) -> None:
    for variable, value in zip(model.non_trainable_variables, state, strict=True):
        variable.assign(value)


def _max_diff(a: Sequence[np.ndarray], b: Sequence[np.ndarray]) -> float:
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


def _gradient_fn(model: keras.Model, x: tf.Tensor, mode: str) -> Callable[[], list[np.ndarray]]:
    """The gradients of a training pass of ``model`` on ``x``: run eagerly, as a graph (as
    Keras trains), or XLA-compiled."""
    def step() -> list[tf.Tensor]:
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True)))
        return tape.gradient(loss, model.trainable_variables)

    if mode != "eager":
        step = tf.function(step, jit_compile=mode == "xla")
    return lambda: [g.numpy() for g in step()]


@pytest.mark.parametrize("name, mode", [
    ("resnet50_tiny", "graph"), ("deeplabv3plus_tiny", "graph"), ("tiramisu_tiny", "graph"),
    ("tiramisu_tiny", "eager"), pytest.param("tiramisu_tiny", "xla", marks=pytest.mark.slow)])
def test_gradients_and_state_equal_those_without_recomputation(name: str, mode: str) -> None:
    model = _build(name)
    rule = models.block_rule(name)
    runs = _count_block_runs(model, rule)
    x = tf.random.stateless_normal((2, SIZES[name], SIZES[name], 3), seed=(1, 2))
    start = _state(model)
    plain = _gradient_fn(model, x, mode)()
    plain_state = _state(model)
    assert runs.numpy() == (once := len({rule(layer.name) for layer in model.layers} - {None}))
    assert _max_diff(plain_state, start) > 0  # the step moved statistics (and seeds)

    _restore(model, start)
    blocks = recompute_blocks(model, rule)
    assert len(blocks) == once
    runs.assign(0)
    step = _gradient_fn(model, x, mode)
    recomputed = step()
    assert runs.numpy() == 2 * once  # forward pass + recomputation
    assert _max_diff(recomputed, plain) < 1e-5
    # Batch-norm moving statistics and dropout seeds advance once, as without recomputation.
    assert _max_diff(_state(model), plain_state) == 0
    if name == "tiramisu_tiny":
        # Equality needs the recomputation to reuse the forward pass's dropout masks: the
        # next seed state gives other gradients.
        assert _max_diff(step(), plain) > 1e-3


def _one_step(recompute: bool) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Weights and non-trainable state of tiramisu_tiny after one mixed-float16 training step of
    two accumulated micro-batches."""
    keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = _build("tiramisu_tiny", channels=4)
        optimizer = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1))
        model.compile(optimizer, keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        optimizer.build(model.trainable_variables)
        accumulate_gradients(model, 2)
        if recompute:
            recompute_blocks(model, models.block_rule("tiramisu_tiny"))
        rng = np.random.default_rng(3)
        x = rng.normal(size=(4, 16, 16, 4)).astype("float32")
        y = rng.integers(0, 3, (4, 16, 16)).astype("int32")
        model.train_on_batch(x, y)
        return [v.numpy() for v in model.trainable_variables], _state(model)
    finally:
        keras.mixed_precision.set_global_policy("float32")


def test_composes_with_accumulation_and_mixed_precision() -> None:
    weights, state = _one_step(recompute=False)
    recomputed_weights, recomputed_state = _one_step(recompute=True)
    assert _max_diff(recomputed_weights, weights) < 1e-5
    assert _max_diff(recomputed_state, state) < 1e-5


def test_models_without_blocks_are_refused_with_the_models_that_have_them() -> None:
    with pytest.raises(ValueError, match=r"--model=tiny_cnn has none \(models with blocks: "
                                         r"deeplabv3plus, .*resnet50_tiny, tiramisu.*\)"):
        models.block_rule("tiny_cnn")
    assert {"resnet50", "resnet50_tiny", "deeplabv3plus", "deeplabv3plus_os8",
            "deeplabv3plus_tiny", "tiramisu", "tiramisu56", "tiramisu67", "tiramisu103",
            "tiramisu_tiny"} <= set(models.BLOCKS.names())


def _chain() -> keras.Model:
    inputs = keras.Input((4,))
    a = layers.Dense(4, name="a_1")(inputs)
    b = layers.Dense(4, name="b_1")(a)
    return keras.Model(inputs, layers.Add(name="a_2")([a, b]))


def test_bad_rules_and_models_are_refused() -> None:
    with pytest.raises(ValueError, match=r"blocks \['a'\] are not contiguous"):
        recompute_blocks(_chain(), lambda name: name.split("_")[0] if name != "b_1" else None)
    with pytest.raises(ValueError, match="puts none of its layers in a block"):
        recompute_blocks(_chain(), lambda name: None)
    model = _chain()
    recompute_blocks(model, lambda name: "all")
    with pytest.raises(ValueError, match="its call is already replaced"):
        recompute_blocks(model, lambda name: "all")


@pytest.mark.slow
@requires_horovod
def test_horovod_two_workers_train_as_without_recomputation(tmp_path: Path) -> None:
    """Two real workers end with the weights of the same run without recomputation, and the
    model they save is a plain Keras model, without the replaced calls. (XLA is left out:
    compiling tiramisu_tiny four times took 90 s of CI, and recomputation under XLA is checked
    in one process by the ``tiramisu_tiny-xla`` case above.)"""
    weights = []
    for recompute in (True, False):
        run = tmp_path / f"recompute-{recompute}"
        proc = run_train("--model=tiramisu_tiny", "--dataset=synthetic_seg", "--image_size=32",
                         "--input_channels=16", "--num_classes=3", "--batch_size=2",
                         "--steps=2", "--log_every=1", "--tensorboard=false",
                         "--strategy=horovod", "--num_processes=2", f"--recompute={recompute}",
                         f"--model_dir={run}")
        assert proc.returncode == 0, proc.stderr[-3000:]
        results = read_results(run)
        assert results["num_workers"] == 2 and np.isfinite(results["final_loss"])
        saved = keras.models.load_model(run / "model.keras")
        assert "call" not in vars(saved)
        weights.append(saved.get_weights())
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(*weights, strict=True)) < 1e-5
