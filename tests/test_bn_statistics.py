"""Batch-norm statistics recomputed with the weights fixed (:mod:`tfscale.training.bn_statistics`).

In one process: the statistics are the population's of each layer's inputs, with earlier
layers normalizing each per-replica batch as in training; frozen layers, a model without batch
norm, XLA-compiled and recomputed forward passes, mixed precision and the zoo's segmentation
models. Across workers (the same images, split over 2 workers, give what one process gives)
in tests/test_sync_bn.py, whose runs this shares.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import requires_horovod, run_process
from tfscale.strategies.base import jit_compile_forward
from tfscale.training import bn_statistics
from tfscale.training.bn_statistics import Recomputer, Statistics, agree, resolve_mode
from tfscale.training.recompute import recompute_blocks

SHAPE = (6, 6, 3)


def two_bn_model(name: str = "two_bn") -> keras.Model:
    keras.utils.set_random_seed(3)
    inputs = keras.Input(SHAPE)
    x = keras.layers.Conv2D(4, 3, padding="same", name="b1_conv")(inputs)
    x = keras.layers.BatchNormalization(name="b1_bn")(x)
    x = keras.layers.ReLU(name="b1_relu")(x)
    x = keras.layers.Conv2D(5, 3, padding="same", name="b2_conv")(x)
    x = keras.layers.BatchNormalization(name="b2_bn")(x)
    x = keras.layers.GlobalAveragePooling2D(name="pool")(x)
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(x), name=name)


def batches(count: int, rows: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [(rng.random((rows, *SHAPE)) * (1 + i) + i).astype(np.float32) for i in range(count)]


def expected_statistics(model: keras.Model, chunks: list[np.ndarray]
                        ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Both layers' population mean and variance over ``chunks``, each chunk normalized by
    the first layer with its own moments (as in training), computed with NumPy."""
    conv1, bn1 = model.get_layer("b1_conv"), model.get_layer("b1_bn")
    conv2 = model.get_layer("b2_conv")
    firsts, seconds = [], []
    for chunk in chunks:
        h = np.asarray(conv1(chunk), np.float64)
        firsts.append(h)
        mean, var = h.mean(axis=(0, 1, 2)), h.var(axis=(0, 1, 2))
        normalized = (h - mean) / np.sqrt(var + bn1.epsilon) * np.asarray(bn1.gamma) + np.asarray(
            bn1.beta)
        seconds.append(np.asarray(conv2(np.maximum(normalized, 0).astype(np.float32)),
                                  np.float64))
    out = []
    for values in (firsts, seconds):
        flat = np.concatenate([v.reshape(-1, v.shape[-1]) for v in values])
        out.append((flat.mean(axis=0), flat.var(axis=0)))
    return out


def moving(model: keras.Model, name: str) -> tuple[np.ndarray, np.ndarray]:
    layer = model.get_layer(name)
    return np.asarray(layer.moving_mean), np.asarray(layer.moving_variance)


def assert_statistics(model: keras.Model, chunks: list[np.ndarray], atol: float = 1e-5) -> None:
    for name, (mean, var) in zip(("b1_bn", "b2_bn"), expected_statistics(model, chunks),
                                 strict=True):
        got_mean, got_var = moving(model, name)
        np.testing.assert_allclose(got_mean, mean, atol=atol, rtol=1e-5, err_msg=name)
        np.testing.assert_allclose(got_var, var, atol=atol, rtol=1e-5, err_msg=name)


def identity(values: np.ndarray) -> np.ndarray:
    return values


def test_statistics_are_the_population_of_each_layers_inputs_per_replica_batch() -> None:
    model = two_bn_model()
    data = batches(3, 8)  # process batches of 8: two per-replica batches of 4 each
    report = Recomputer(model, identity, per_replica_batch=4).recompute(iter(data), images=24)
    assert (report.layers, report.images, report.batches, report.unreached) == (2, 24, 6, ())
    assert_statistics(model, [c for b in data for c in (b[:4], b[4:])])
    assert "recomputed over 24 training images (6 batch(es) per replica) for 2 layers" in (
        report.describe())
    # Before: Keras' initial (0, 1), which the recomputation replaced.
    assert not np.allclose(moving(two_bn_model(), "b2_bn")[1], moving(model, "b2_bn")[1])


def test_images_round_up_to_whole_batches_and_the_source_repeats() -> None:
    model = two_bn_model()
    data = batches(1, 4)
    again = bn_statistics.repeat_batches(lambda: iter(data))
    report = Recomputer(model, identity, per_replica_batch=4).recompute(again, images=9)
    assert (report.images, report.batches) == (12, 3)
    assert_statistics(model, data * 3)


def test_a_source_that_ends_early_or_has_odd_batches_is_refused() -> None:
    recomputer = Recomputer(two_bn_model(), identity, per_replica_batch=4)
    with pytest.raises(ValueError, match=r"ended after 2 of 3 batches per replica; give fewer "
                                         r"--bn_statistics_images"):
        recomputer.recompute(iter(batches(1, 8)), images=12)
    with pytest.raises(ValueError, match=r"a training batch of 6 rows is not a multiple of 1 "
                                         r"replica\(s\) x 4 examples"):
        recomputer.recompute(iter(batches(1, 6)), images=4)


def test_frozen_layers_keep_their_statistics_and_no_batch_norm_costs_nothing() -> None:
    model = two_bn_model()
    model.get_layer("b1_bn").trainable = False
    data = batches(2, 4)
    Recomputer(model, identity, per_replica_batch=4).recompute(iter(data), images=8)
    np.testing.assert_array_equal(moving(model, "b1_bn")[0], np.zeros(4))
    assert not np.allclose(moving(model, "b2_bn")[0], 0)

    inputs = keras.Input(SHAPE)
    plain = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Flatten()(inputs)))

    def untouchable() -> Iterator[np.ndarray]:
        raise AssertionError("a model without batch norm read training data")
        yield  # pragma: no cover

    report = Recomputer(plain, identity, per_replica_batch=4).recompute(untouchable(), 1024)
    assert report == bn_statistics.Report(0, 0, 0, 0.0)
    assert "no trainable batch-norm layer" in report.describe()


@pytest.mark.parametrize("forward", ["xla", "recompute"])
def test_xla_compiled_and_recomputed_forward_passes_are_recorded(forward: str) -> None:
    model = two_bn_model(forward)
    if forward == "xla":
        jit_compile_forward(model)
        model(batches(1, 4)[0], training=True)  # traced for training before, as fit does
    else:
        model.compile(optimizer="sgd", loss="mse")
        recompute_blocks(model, lambda name: name.split("_")[0] if name[0] == "b" else None)
    data = batches(2, 4)
    Recomputer(model, identity, per_replica_batch=4).recompute(iter(data), images=8)
    assert_statistics(model, data)
    # The model's own forward pass is back in place.
    assert ("python_function" in dir(vars(model)["call"])) == (forward == "xla")


def test_mixed_precision_statistics_are_float32_of_the_upcast_inputs() -> None:
    keras.mixed_precision.set_dtype_policy("mixed_bfloat16")
    try:
        model = two_bn_model("mixed")
    finally:
        keras.mixed_precision.set_dtype_policy("float32")
    data = batches(2, 4)
    Recomputer(model, identity, per_replica_batch=4).recompute(iter(data), images=8)
    mean, var = moving(model, "b1_bn")
    assert mean.dtype == np.float32 and var.dtype == np.float32
    h = np.concatenate([np.asarray(tf.cast(model.get_layer("b1_conv")(d), tf.float32))
                        for d in data]).reshape(-1, 4)
    np.testing.assert_allclose(mean, h.mean(axis=0), atol=1e-5)
    np.testing.assert_allclose(var, h.var(axis=0), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", ["deeplabv3plus_tiny", "tiramisu_tiny"])
def test_segmentation_models_reach_every_batch_norm_layer(name: str) -> None:
    import models
    from tfscale.config.train_config import TrainConfig

    model = models.MODELS.get(name)(TrainConfig(model=name, image_size=32, num_classes=3))
    data = [np.random.default_rng(0).random((2, 32, 32, 3), np.float32)]
    report = Recomputer(model, identity, per_replica_batch=2).recompute(iter(data), images=2)
    assert report.layers == len(bn_statistics.tracked_layers(model)) > 10
    assert report.unreached == ()
    for layer in bn_statistics.tracked_layers(model):
        assert np.all(np.isfinite(layer.moving_variance)) and not np.allclose(
            layer.moving_variance, 1.0), layer.name


def test_ema_statistics_are_pooled_over_the_workers() -> None:
    models = [two_bn_model("w0"), two_bn_model("w1")]
    for i, model in enumerate(models):
        layer = model.get_layer("b1_bn")
        layer.moving_mean.assign(np.full(4, 2.0 * i, np.float32))
        layer.moving_variance.assign(np.full(4, 1.0 + i, np.float32))
    local = []

    def exchange(values: np.ndarray) -> np.ndarray:  # two workers' sum, each calling in turn
        local.append(values)
        return local[0] + local[1] if len(local) == 2 else values

    agree(models[0], exchange, workers=2)
    assert agree(models[1], exchange, workers=2) == 2
    mean, var = moving(models[1], "b1_bn")
    # Two populations of equal weight: means 0 and 2, variances 1 and 2.
    np.testing.assert_allclose(mean, np.full(4, 1.0))
    np.testing.assert_allclose(var, np.full(4, (1 + 0) / 2 + (2 + 4) / 2 - 1.0))
    assert agree(models[0], identity, workers=1) == 0


@pytest.mark.parametrize("keep_bytes", [bn_statistics.KEEP_BYTES, 0])
def test_refresh_once_per_step_reads_the_same_batches_and_the_modes(
        keep_bytes: int, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bn_statistics, "KEEP_BYTES", keep_bytes)
    model = two_bn_model()
    model.compile(optimizer="sgd", loss="mse")
    step = [5]
    reads = []

    def source() -> Iterator[np.ndarray]:
        reads.append(step[0])
        return iter(batches(1, 4))

    logged: list[str] = []
    stats = Statistics("precise", Recomputer(model, identity, 4), source, 4, 1,
                       lambda: step[0], logged.append)
    stats.refresh()
    stats.refresh()
    step[0] = 6
    stats.refresh()
    # Kept in memory when they fit, else read again from the start.
    assert reads == ([5] if keep_bytes else [5, 6]) and len(stats.reports) == 2
    assert_statistics(model, batches(1, 4))
    assert logged[0].startswith("step 5: batch-norm statistics recomputed over 4 training")
    assert resolve_mode("auto", reads_data=True) == "precise"
    assert resolve_mode("auto", reads_data=False) == "ema"
    with pytest.raises(ValueError, match=r"--bn_statistics='fresh'; expected one of auto, ema, "
                                         r"precise"):
        resolve_mode("fresh", True)


@pytest.mark.slow
@pytest.mark.parametrize(("strategy", "api"), [
    pytest.param("horovod", "prepare", marks=requires_horovod), ("multiworker", "keras")])
def test_users_scripts_end_with_the_statistics_of_both_workers_images(
        strategy: str, api: str, tmp_path: Path) -> None:
    """A user's script on 2 workers (tfscale.prepare under horovod; the callback in a plain
    MultiWorkerMirroredStrategy script): both end with the same statistics, those one process
    computes from the trained weights over both workers' first batches."""
    from tests.workers import bn_script

    proc = run_process([sys.executable, "-m", "tfscale.run", "--nproc=2",
                        f"--strategy={strategy}", "-m", "tests.workers.bn_script",
                        f"--out={tmp_path}", f"--api={api}"], timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    ranks = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    weights = [[f[f"w{i}"] for i in range(len(f.files) - 1)] for f in ranks]
    for a, b in zip(*weights, strict=True):
        np.testing.assert_array_equal(a, b)
    model = bn_script.build_model()
    model.set_weights(weights[0])
    trained = [moving(model, name) for name in ("b1_bn", "b2_bn")]
    images = np.concatenate([f["images"] for f in ranks])
    assert len(images) == bn_script.IMAGES
    Recomputer(model, identity, bn_script.BATCH).recompute(
        iter([images[i:i + bn_script.BATCH] for i in range(0, len(images), bn_script.BATCH)]),
        bn_script.IMAGES)
    for (mean, var), name in zip(trained, ("b1_bn", "b2_bn"), strict=True):
        np.testing.assert_allclose(mean, moving(model, name)[0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(var, moving(model, name)[1], rtol=1e-5, atol=1e-5)
