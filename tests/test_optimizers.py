"""LARS and LARC against NumPy implementations of the published formulas; build_optimizer."""

from __future__ import annotations

import contextlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import run_process
from tests.equivalence import max_abs_diff
from tfscale.callbacks import optimizer_step
from tfscale.config.train_config import TrainConfig
from tfscale.training.optimizers import (
    LARC,
    LARS,
    SGD,
    WarmupDecay,
    build_optimizer,
    exclude_bias_bn_from_decay,
    fuse,
    scaled_learning_rate,
)

MOMENTUM, ETA, WD, EPS = 0.9, 0.02, 1e-3, 1e-8
STEPS = 5


def reference_lrs() -> list[float]:
    """The WarmupDecay(0.1, warmup 2, cosine to step 6) rates, from the formula."""
    return [0.1 * (s + 1) / 2 if s < 2 else 0.05 * (1 + math.cos(math.pi * (s - 2) / 4))
            for s in range(STEPS)]


def reference_step(
    w: np.ndarray, g: np.ndarray, v: np.ndarray, lr: float, kind: str, adapted: bool,
    trace: list[str],
) -> tuple[np.ndarray, np.ndarray]:
    """One update of one variable, written from the paper (LARS) and from apex's LARC
    followed by momentum SGD; ``trace`` records which branch ran."""
    w_norm, g_norm = np.linalg.norm(w), np.linalg.norm(g)
    if not adapted:
        step = lr * g
        trace.append("excluded")
    elif kind == "lars":
        if w_norm > 0 and g_norm > 0:
            local_lr = ETA * w_norm / (g_norm + WD * w_norm + EPS)
            trace.append("trusted")
        else:
            local_lr = 1.0
            trace.append("fallback")
        step = lr * local_lr * (g + WD * w)
    else:
        if w_norm > 0 and g_norm > 0:
            adaptive_lr = ETA * w_norm / (g_norm + w_norm * WD + EPS)
            if kind == "larc-clip":
                trace.append("clipped" if adaptive_lr / lr < 1 else "unclipped")
                adaptive_lr = min(adaptive_lr / lr, 1.0)
            else:
                trace.append("trusted")
            g = (g + WD * w) * adaptive_lr
        else:
            trace.append("fallback")
        step = lr * g
    v = MOMENTUM * v + step
    return w - v, v


def problem(seed: int = 0) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
    """Initial weights and per-step gradients: a kernel with ordinary gradients, a bias, a
    kernel with tiny gradients (its trust ratio exceeds the learning rate), a zero-initialised
    kernel (trust ratio undefined at the first step) and a kernel whose gradient is always 0."""
    rng = np.random.default_rng(seed)
    weights = [rng.normal(size=(3, 4)), rng.normal(size=(4,)), rng.normal(size=(4, 2)),
               np.zeros((2, 3)), rng.normal(size=(2, 2))]
    scales = [1.0, 1.0, 1e-4, 1.0, 0.0]
    grads = [[c * rng.normal(size=w.shape) for w, c in zip(weights, scales, strict=True)]
             for _ in range(STEPS)]
    return weights, grads


def make_optimizer(kind: str, **kwargs: Any) -> LARS | LARC:
    schedule = WarmupDecay(0.1, warmup_steps=2, total_steps=6, decay="cosine")
    args: dict[str, Any] = dict(momentum=MOMENTUM, eta=ETA, weight_decay=WD, epsilon=EPS,
                                **kwargs)
    if kind == "lars":
        return LARS(schedule, **args)
    return LARC(schedule, mode=kind.split("-")[1], **args)


def run_keras(optimizer: keras.optimizers.Optimizer, weights: list[np.ndarray],
              grads: list[list[np.ndarray]], graph: bool, scale: float = 1.0) -> list[np.ndarray]:
    variables = [keras.Variable(w.astype("float32"), name=f"v{i}") for i, w in enumerate(weights)]
    optimizer.build(variables)

    def apply(step_grads: list[Any]) -> None:
        optimizer.apply(step_grads, variables)

    apply_fn = tf.function(apply) if graph else apply
    for step_grads in grads:
        apply_fn([tf.constant(g * scale, tf.float32) for g in step_grads])
    return [np.asarray(v.numpy(), np.float64) for v in variables]


def run_reference(kind: str, weights: list[np.ndarray], grads: list[list[np.ndarray]],
                  adapted: list[bool]) -> tuple[list[np.ndarray], list[str]]:
    ws = [w.astype(np.float32).astype(np.float64) for w in weights]
    vs = [np.zeros_like(w) for w in ws]
    trace: list[str] = []
    for lr, step_grads in zip(reference_lrs(), grads, strict=True):
        for i, g in enumerate(step_grads):
            g = g.astype(np.float32).astype(np.float64)
            ws[i], vs[i] = reference_step(ws[i], g, vs[i], lr, kind, adapted[i], trace)
    return ws, trace


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "tf_function"])
@pytest.mark.parametrize("kind", ["lars", "larc-clip", "larc-scale"])
def test_update_matches_published_formulas(kind: str, graph: bool) -> None:
    weights, grads = problem()
    got = run_keras(make_optimizer(kind), weights, grads, graph)
    want, trace = run_reference(kind, weights, grads, [w.ndim > 1 for w in weights])
    assert max_abs_diff(got, want) < 1e-6
    assert {"excluded", "fallback"} <= set(trace)
    if kind == "larc-clip":
        assert {"clipped", "unclipped"} <= set(trace)
    assert all(np.abs(a - w).max() > 1e-4 for a, w in zip(got[:4], weights[:4], strict=True))


@pytest.mark.parametrize("kind", ["lars", "larc-clip"])
def test_exclusion_is_configurable(kind: str) -> None:
    weights, grads = problem(seed=1)
    everything = run_keras(make_optimizer(kind, exclude_bias_bn=False), weights, grads, False)
    want, _ = run_reference(kind, weights, grads, [True] * len(weights))
    assert max_abs_diff(everything, want) < 1e-6
    by_path = run_keras(make_optimizer(kind, exclude_patterns=[r"^v2$"]), weights, grads, False)
    want, _ = run_reference(kind, weights, grads, [i not in (1, 2) for i in range(5)])
    assert max_abs_diff(by_path, want) < 1e-6


def test_inside_loss_scale_optimizer() -> None:
    weights, grads = problem(seed=2)
    wrapped = keras.optimizers.LossScaleOptimizer(make_optimizer("larc-clip"),
                                                  initial_scale=1024.0)
    got = run_keras(wrapped, weights, grads, graph=True, scale=1024.0)
    want, _ = run_reference("larc-clip", weights, grads, [w.ndim > 1 for w in weights])
    assert max_abs_diff(got, want) < 1e-6


def test_invalid_arguments_are_named() -> None:
    with pytest.raises(ValueError, match="momentum=1.5"):
        LARS(0.1, momentum=1.5)
    with pytest.raises(ValueError, match="eta=0"):
        LARS(0.1, eta=0.0)
    with pytest.raises(ValueError, match="weight_decay=-1"):
        LARC(0.1, weight_decay=-1.0)
    with pytest.raises(ValueError, match="mode='trim'.*clip, scale"):
        LARC(0.1, mode="trim")


def config(**changes: Any) -> TrainConfig:
    return TrainConfig(model="tiny_cnn", steps=20, **changes)


@pytest.mark.parametrize(("name", "cls", "attrs"), [
    ("sgd", SGD, {"nesterov": False, "momentum": 0.8}),
    ("nesterov", SGD, {"nesterov": True, "momentum": 0.8}),
    ("adamw", keras.optimizers.AdamW, {"beta_1": 0.8}),
    ("lamb", keras.optimizers.Lamb, {"beta_1": 0.8}),
    ("lars", LARS, {"momentum": 0.8, "eta": 0.003, "weight_decay": 5e-5,
                    "exclude_bias_bn": False}),
    ("larc", LARC, {"momentum": 0.8, "eta": 0.003, "weight_decay": 5e-5,
                    "exclude_bias_bn": False, "mode": "scale"}),
])
def test_build_optimizer_picks_the_named_class(name: str, cls: type, attrs: dict[str, Any]) -> None:
    cfg = config(optimizer=name, momentum=0.8, lars_eta=0.003, weight_decay=5e-5,
                 lars_exclude_bias_bn=False, larc_mode="scale")
    optimizer = build_optimizer(cfg, world_size=1, total_steps=20)
    assert type(optimizer) is cls
    assert {k: getattr(optimizer, k) for k in attrs} == attrs


@pytest.mark.parametrize("name", ["sgd", "lars", "larc"])
def test_linear_scaling_reaches_world_size_times_lr_at_end_of_warmup(name: str) -> None:
    cfg = config(optimizer=name, learning_rate=0.1, lr_scaling="linear", warmup_steps=5)
    assert scaled_learning_rate(cfg, 8) == pytest.approx(0.8)
    assert scaled_learning_rate(cfg.replace(lr_scaling="none"), 8) == pytest.approx(0.1)
    optimizer = build_optimizer(cfg, world_size=4, total_steps=20)
    seen = []
    for step in (0, 4, 5):
        optimizer.iterations.assign(step)
        seen.append(float(optimizer.learning_rate))
    assert seen == pytest.approx([0.08, 0.4, 0.4])
    unscaled = build_optimizer(cfg.replace(lr_scaling="none"), world_size=4, total_steps=20)
    unscaled.iterations.assign(4)
    assert float(unscaled.learning_rate) == pytest.approx(0.1)


def regression_model(optimizer: keras.optimizers.Optimizer) -> keras.Model:
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.BatchNormalization(), keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse", jit_compile=True)
    return model


def test_model_trains_with_lars_and_round_trips_through_keras_file(tmp_path: Path) -> None:
    cfg = config(optimizer="lars", learning_rate=0.1, lars_eta=0.05, weight_decay=1e-4,
                 warmup_steps=2)
    model = regression_model(build_optimizer(cfg, world_size=1, total_steps=20))
    rng = np.random.default_rng(0)
    x = rng.normal(size=(64, 6)).astype("float32")
    y = x @ rng.normal(size=(6, 1)).astype("float32")
    history = model.fit(x, y, batch_size=16, epochs=4, shuffle=False, verbose=0)
    losses = history.history["loss"]
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses
    assert losses[-1] < 0.5 * losses[0], losses

    model.save(tmp_path / "lars.keras")
    loaded = keras.models.load_model(tmp_path / "lars.keras")
    assert type(loaded.optimizer) is LARS
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    assert isinstance(loaded.optimizer._learning_rate, WarmupDecay)
    assert int(loaded.optimizer.iterations.numpy()) == 16
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables, strict=True):
        np.testing.assert_array_equal(np.asarray(a.numpy()), np.asarray(b.numpy()))
    # Same weights, velocities and step: one more batch must give identical weights.
    model.train_on_batch(x[:16], y[:16])
    loaded.train_on_batch(x[:16], y[:16])
    for a, b in zip(loaded.get_weights(), model.get_weights(), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)


def test_larc_config_round_trip() -> None:
    optimizer = LARC(WarmupDecay(0.2, 3, 10, "polynomial"), momentum=0.5, eta=0.01,
                     weight_decay=1e-4, exclude_patterns=["norm"], mode="scale")
    copy = keras.optimizers.deserialize(keras.optimizers.serialize(optimizer))
    assert type(copy) is LARC
    assert copy.get_config() == optimizer.get_config()
    assert (copy.mode, copy.eta, copy.exclude_patterns) == ("scale", 0.01, ("norm",))


MIRRORED = """
import json
import numpy as np
import tensorflow as tf
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
import keras
from tfscale.training.optimizers import LARC, LARS, SGD

rng = np.random.default_rng(0)
x = rng.normal(size=(32, 5)).astype("float32")
y = rng.normal(size=(32, 1)).astype("float32")
init = [rng.normal(size=s).astype("float32") for s in [(5, 4), (4,), (4, 1), (1,)]]

def train(strategy, optimizer_cls, **kwargs):
    with strategy.scope():
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(4), keras.layers.Dense(1)])
        model.set_weights(init)
        model.compile(optimizer_cls(**{"learning_rate": 0.1, **kwargs}), "mse")
    model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
    return model.get_weights()

out = {}
for name, cls, kwargs in [("lars", LARS, {"eta": 0.02, "weight_decay": 1e-3}),
                          ("larc", LARC, {"eta": 0.02, "weight_decay": 1e-3, "mode": "clip"}),
                          ("sgd", SGD, {"learning_rate": 0.01, "momentum": 0.9})]:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"])
    mirrored = train(strategy, cls, **kwargs)
    single = train(tf.distribute.get_strategy(), cls, **kwargs)
    out[name] = {"replicas": strategy.num_replicas_in_sync,
                 "diff": max(float(np.abs(a - b).max()) for a, b in zip(mirrored, single)),
                 "moved": min(float(np.abs(a - b).max()) for a, b in zip(mirrored, init))}
# tfscale's fused SGD under the strategy: the same weights as Keras' SGD, bit for bit.
keras_sgd = train(tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]), keras.optimizers.SGD,
                  learning_rate=0.01, momentum=0.9)
out["sgd"]["keras_diff"] = max(float(np.abs(a - b).max()) for a, b in zip(mirrored, keras_sgd))
print("RESULT", json.dumps(out))
"""


def test_mirrored_two_replicas_match_one_device() -> None:
    proc = run_process([sys.executable, "-c", MIRRORED], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(s for s in proc.stdout.splitlines() if s.startswith("RESULT "))
    for name, result in json.loads(line.split(" ", 1)[1]).items():
        assert result["replicas"] == 2, (name, result)
        assert result["diff"] < 1e-5, (name, result)
        assert result["moved"] > 1e-3, (name, result)
        assert result.get("keras_diff", 0.0) == 0.0, (name, result)


@pytest.mark.parametrize("mirrored", [False, True])
def test_optimizer_step_reads_the_counter_with_or_without_a_strategy(mirrored: bool) -> None:
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"]) if mirrored else None
    with strategy.scope() if strategy else contextlib.nullcontext():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x = np.ones((6, 2), np.float32)
    model.fit(x, x[:, :1], batch_size=2, epochs=1, verbose=0)
    counter = model.optimizer.iterations
    # Under the strategy the counter is a mirrored variable; the step is read from its copy.
    assert isinstance(counter.value, tf.distribute.DistributedValues) == mirrored
    assert optimizer_step(model) == int(counter.numpy()) == 3


@pytest.mark.parametrize("kind", ["sgd", "nesterov", "adamw", "lamb"])
def test_bias_and_batch_norm_variables_excluded_from_decay(kind: str) -> None:
    """--exclude_bias_bn_decay: one step of zero gradients decays the kernel only (with the
    flag off, every variable)."""
    cfg = TrainConfig(optimizer=kind, learning_rate=0.5, weight_decay=0.1, momentum=0.0)
    decayed = {}
    for exclude in (False, True):
        kernel = keras.Variable(np.ones((2, 3), np.float32), name="kernel")
        bias, gamma = (keras.Variable(np.ones(3, np.float32), name=n) for n in ("bias", "gamma"))
        optimizer = build_optimizer(cfg, 1, 10)
        if exclude:
            assert exclude_bias_bn_from_decay(optimizer, [kernel, bias, gamma]) == 2
        optimizer.apply([tf.zeros_like(v) for v in (kernel, bias, gamma)], [kernel, bias, gamma])
        decayed[exclude] = [bool(np.all(np.asarray(v) < 1)) for v in (kernel, bias, gamma)]
    assert decayed == {False: [True, True, True], True: [True, False, False]}
    lars = build_optimizer(cfg.replace(optimizer="lars"), 1, 10)
    assert exclude_bias_bn_from_decay(lars, [kernel, bias]) == 0  # lars_exclude_bias_bn's


# --- the fused SGD ----------------------------------------------------------------------------

def _sgd_steps(cls: type, compiled: str, **kwargs: Any) -> list[np.ndarray]:
    """Weights and momentums after 4 steps of fixed gradients from fixed weights."""
    rng = np.random.default_rng(3)
    shapes = [(6, 5), (5,), (5, 3)]
    variables = [keras.Variable(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    grads = [[tf.constant(rng.standard_normal(s).astype(np.float32)) for s in shapes]
             for _ in range(4)]
    optimizer = cls(WarmupDecay(0.1, 2, 10, "cosine"), **kwargs)

    def step(g: list[tf.Tensor]) -> None:
        optimizer.apply(g, variables)

    run = step if compiled == "eager" else tf.function(step, jit_compile=compiled == "xla")
    for g in grads:
        run(g)
    return [v.numpy() for v in variables] + [m.numpy() for m in optimizer.momentums]


@pytest.mark.parametrize("compiled", ["eager", "graph", "xla"])
@pytest.mark.parametrize("kwargs", [{"momentum": 0.9}, {"momentum": 0.9, "nesterov": True},
                                    {"momentum": 0.8, "weight_decay": 1e-2}])
def test_fused_sgd_gives_keras_sgd_weights_bit_for_bit(compiled: str,
                                                       kwargs: dict[str, Any]) -> None:
    ours, theirs = (_sgd_steps(cls, compiled, **kwargs) for cls in (SGD, keras.optimizers.SGD))
    for a, b in zip(ours, theirs, strict=True):
        if compiled == "xla":  # XLA fuses the two graphs' arithmetic each its own way
            np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
        else:
            np.testing.assert_array_equal(a, b)
    assert max(float(np.abs(m).max()) for m in ours[3:]) > 0  # the momentums moved


def _op_types(optimizer: keras.optimizers.Optimizer, grads: list[Any],
              variables: list[keras.Variable]) -> set[str]:
    optimizer.build(variables)
    graph = tf.function(lambda: optimizer.apply(grads, variables)).get_concrete_function().graph
    types = set()
    for op in graph.get_operations():
        types.add(op.type)
        for function in getattr(op, "_called_functions", lambda: [])() or []:
            types.update(o.type for o in function.graph.get_operations())
    return types


def test_fused_sgd_takes_the_one_pass_kernel_only_where_it_applies() -> None:
    dense = [keras.Variable(np.ones((4, 3), np.float32))]
    assert "ResourceApplyKerasMomentum" in _op_types(
        SGD(0.1, momentum=0.9), [tf.ones((4, 3))], dense)
    assert "ResourceApplyKerasMomentum" not in _op_types(
        keras.optimizers.SGD(0.1, momentum=0.9), [tf.ones((4, 3))],
        [keras.Variable(np.ones((4, 3), np.float32))])
    # Keras' own update: without momentum, and for sparse rows (an embedding's gradient).
    assert "ResourceApplyKerasMomentum" not in _op_types(
        SGD(0.1), [tf.ones((4, 3))], [keras.Variable(np.ones((4, 3), np.float32))])
    rows = tf.IndexedSlices(tf.ones((2, 3)), tf.constant([0, 2]), tf.constant([4, 3]))
    table = keras.Variable(np.ones((4, 3), np.float32))
    ours = SGD(0.1, momentum=0.9)
    assert "ResourceApplyKerasMomentum" not in _op_types(ours, [rows], [table])
    ours.apply([rows], [table])
    np.testing.assert_allclose(table.numpy()[[0, 2]], 0.9)  # 1 - 0.1 x 1 on the given rows
    np.testing.assert_array_equal(table.numpy()[[1, 3]], 1.0)


def test_fuse_swaps_only_keras_own_sgd() -> None:
    plain = keras.optimizers.SGD(0.1, momentum=0.9)
    assert fuse(plain) is plain and type(plain) is SGD
    scaled = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.9))
    assert type(fuse(scaled).inner_optimizer) is SGD
    lars = LARS(0.1)
    assert type(fuse(lars)) is LARS
    adam = keras.optimizers.Adam()
    assert type(fuse(adam)) is keras.optimizers.Adam


def test_fused_sgd_saves_and_reloads_as_keras_sgd(tmp_path: Path) -> None:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(SGD(0.05, momentum=0.7, nesterov=True), "mse")
    model.fit(np.ones((4, 3), np.float32), np.zeros((4, 2), np.float32), verbose=0)
    model.save(tmp_path / "m.keras")
    loaded = keras.models.load_model(tmp_path / "m.keras")
    assert type(loaded.optimizer) is keras.optimizers.SGD
    assert loaded.optimizer.get_config() == model.optimizer.get_config()
    for a, b in zip(loaded.optimizer.variables, model.optimizer.variables, strict=True):
        np.testing.assert_array_equal(a.numpy(), b.numpy())
