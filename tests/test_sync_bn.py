"""Synchronized batch norm (``--sync_bn``, ``--sync_bn_group``), and batch-norm statistics
recomputed across workers (``--bn_statistics=precise``), from the same runs.

The worker (:mod:`tests.workers.sync_bn`) runs one SGD step on a global batch of 8 whose two
halves have different statistics, recording each replica's batch-norm moments, its loss and
the weights after the step (which reveal the gradients). Synchronized over all replicas, every
multi-replica strategy must equal one process on the whole batch (the reference); in groups of
two halves, or unsynchronized on two replicas, each replica normalizes its half (``halves``),
which differs from the reference by far more than the tolerance, so the equalities can fail.

The worker also recomputes the statistics over 3 more such batches, before and after the step.
Split over 2 workers (or replicas), they must equal one process's over the same batches, each
per-replica batch normalized as in training, and be the same on every worker; Keras' moving
averages after the step differ between the two workers, so the equality can fail.
"""

from __future__ import annotations

import dataclasses
import io
import re
import sys
from pathlib import Path

import keras
import numpy as np
import pytest
import tensorflow as tf

from models.small import tiny_cnn
from tests.conftest import TINY, horovodrun, read_results, requires_horovod, run_process, run_train
from tfscale.config.train_config import TrainConfig
from tfscale.scripts.launcher import supervise, tf_config_envs
from tfscale.strategies.base import replica_groups
from tfscale.strategies.default import DefaultStrategy
from tfscale.training.sync_bn import (
    batch_norm_layers,
    synchronize_batch_norm,
    synchronize_under_strategy,
)

WORKER = [sys.executable, "-m", "tests.workers.sync_bn"]
TOL = 1e-5


@dataclasses.dataclass
class Step:
    """One variant's step over all ranks: every replica's moments [replicas, 2, channels], the
    loss of the global batch and the weights after the step."""

    moments: np.ndarray
    loss: float
    weights: list[np.ndarray]

    def diff(self, other: Step) -> tuple[float, float, float]:
        """Largest differences of moments (replica by replica), loss and weights."""
        assert self.moments.shape == other.moments.shape
        weights = max(float(np.max(np.abs(a - b)))
                      for a, b in zip(self.weights, other.weights, strict=True))
        return (float(np.max(np.abs(self.moments - other.moments))),
                abs(self.loss - other.loss), weights)

    def per_replica(self, replicas: int) -> Step:
        """The same step as seen by ``replicas`` replicas, each of an equal consecutive share
        of this step's replicas (their moments repeated)."""
        repeat = replicas // len(self.moments)
        return dataclasses.replace(self, moments=np.repeat(self.moments, repeat, axis=0))


def _load(out: Path, variant: str, ranks: int = 1) -> Step:
    files = [np.load(out / variant / f"rank{r}.npz") for r in range(ranks)]
    weights = [[f[f"w{i}"] for i in range(sum(k[0] == "w" for k in f.files))] for f in files]
    for r in range(1, ranks):  # every rank applied the same update
        assert all(np.array_equal(a, b) for a, b in zip(weights[0], weights[r], strict=True))
    # Equal batches per replica: the global loss is the mean of the replicas' losses.
    return Step(np.concatenate([f["moments"] for f in files]),
                float(np.mean(np.concatenate([f["loss"] for f in files]))), weights[0])


def _run_worker(out: Path, *flags: str) -> None:
    proc = run_process([*WORKER, *flags, f"--out={out}"], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _assert_equal(step: Step, expected: Step) -> None:
    moments, loss, weights = step.diff(expected.per_replica(len(step.moments)))
    assert moments < TOL and loss < TOL and weights < TOL, (moments, loss, weights)


def _assert_differs(step: Step, expected: Step) -> None:
    moments, loss, weights = step.diff(expected.per_replica(len(step.moments)))
    assert moments > 1e-2 and loss > 1e-3 and weights > 1e-3, (moments, loss, weights)


def _statistics(out: Path, variant: str, ranks: int = 1) -> dict[str, np.ndarray]:
    """``precise0``, ``ema1`` and ``precise1`` of each rank: [ranks, values]."""
    files = [np.load(out / variant / f"rank{r}.npz") for r in range(ranks)]
    return {name: np.stack([f[name] for f in files]) for name in ("precise0", "ema1", "precise1")}


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Step]:
    out = tmp_path_factory.mktemp("one_process")
    _run_worker(out, "--strategy=default", "--variants=off,all")
    return {variant: _load(out, variant) for variant in ("off", "all")} | {
        f"statistics_{variant}": _statistics(out, variant) for variant in ("off", "all")}


@pytest.fixture(scope="module")
def one_process_in_halves(tmp_path_factory: pytest.TempPathFactory) -> dict[str, np.ndarray]:
    """One process, one replica, normalizing the statistics batches in halves of 4 rows."""
    out = tmp_path_factory.mktemp("one_process_halves")
    _run_worker(out, "--strategy=default", "--variants=off", "--stats_batch=4")
    return _statistics(out, "off")


def _assert_statistics_equal_one_process(out: Path, ranks: int, one_process: dict[str, Step],
                                         in_halves: dict[str, np.ndarray],
                                         halves_after: np.ndarray) -> None:
    """``ranks`` workers' recomputed statistics: the same on each, and one process's over the
    same per-replica batches (in halves unsynchronized; whole batches synchronized); the moving
    averages of unsynchronized workers differ."""
    plain, synchronized = _statistics(out, "off", ranks), _statistics(out, "all", ranks)
    for stats in (plain, synchronized):
        for name in ("precise0", "precise1"):
            assert np.array_equal(stats[name], np.repeat(stats[name][:1], ranks, axis=0)), name
    assert _relative_diff(plain["precise0"][0], in_halves["precise0"][0]) < TOL
    assert _relative_diff(plain["precise1"][0], halves_after) < TOL
    whole = one_process["statistics_off"]
    assert _relative_diff(synchronized["precise0"][0], whole["precise0"][0]) < TOL
    assert _relative_diff(synchronized["precise1"][0], whole["precise1"][0]) < TOL
    if ranks > 1:  # each worker's moving averages saw only its own half
        assert _relative_diff(plain["ema1"][0], plain["ema1"][1]) > 1e-2


def _relative_diff(a: np.ndarray, b: np.ndarray) -> float:
    """Largest difference, relative to values above 1 (variances reach ~80 here, where float32
    holds 6 decimal places)."""
    return float(np.max(np.abs(a - b) / np.maximum(1.0, np.abs(b))))


@pytest.fixture(scope="module")
def reference(one_process: dict[str, Step]) -> Step:
    """One process, one replica on the whole batch, ordinary batch norm."""
    return one_process["off"]


@pytest.fixture(scope="module")
def mirrored_two_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("mirrored2")
    _run_worker(out, "--strategy=mirrored", "--cpu_replicas=2", "--variants=off,all")
    return out


@pytest.fixture(scope="module")
def mirrored_two(mirrored_two_out: Path) -> dict[str, Step]:
    return {variant: _load(mirrored_two_out, variant) for variant in ("off", "all")}


@pytest.fixture(scope="module")
def halves_after(mirrored_two_out: Path) -> np.ndarray:
    """Statistics recomputed after the step in halves: each replica's per-replica batch."""
    return _statistics(mirrored_two_out, "off")["precise1"][0]


@pytest.fixture(scope="module")
def halves(mirrored_two: dict[str, Step]) -> Step:
    """Each half of the batch normalized on its own, gradients averaged."""
    return mirrored_two["off"]


@pytest.mark.slow
def test_one_replica_moments_equal_keras(one_process: dict[str, Step]) -> None:
    # One replica: the sum over replicas is the identity, and the moments, computed as
    # E[x**2] - E[x]**2 from sums, agree with Keras's two-pass moments.
    _assert_equal(one_process["all"], one_process["off"])


@pytest.mark.slow
def test_mirrored_two_replicas_equal_one_process(
        reference: Step, mirrored_two: dict[str, Step], mirrored_two_out: Path,
        one_process: dict[str, Step], one_process_in_halves: dict[str, np.ndarray],
        halves_after: np.ndarray) -> None:
    _assert_equal(mirrored_two["all"], reference)
    _assert_differs(mirrored_two["off"], reference)
    _assert_statistics_equal_one_process(mirrored_two_out, 1, one_process,
                                         one_process_in_halves, halves_after)


@pytest.mark.slow
def test_groups_of_two_among_four_replicas(tmp_path: Path, reference: Step, halves: Step) -> None:
    # Replicas 0-1 read the first half, 2-3 the second: in groups of 2, each group normalizes
    # its half, as 2 unsynchronized replicas of 4 do.
    _run_worker(tmp_path, "--strategy=mirrored", "--cpu_replicas=4", "--variants=2,all")
    _assert_equal(_load(tmp_path, "2"), halves)
    _assert_equal(_load(tmp_path, "all"), reference)


def _check_two_workers(out: Path, reference: Step, halves: Step) -> None:
    synchronized, plain, groups_of_one = (_load(out, v, ranks=2) for v in ("all", "off", "1"))
    _assert_equal(synchronized, reference)
    _assert_differs(plain, reference)
    _assert_equal(plain, halves)
    _assert_equal(groups_of_one, plain)


@pytest.mark.slow
@requires_horovod
@pytest.mark.parametrize("strategy", ["horovod", "ddl"])
def test_horovod_two_workers_equal_one_process(
        strategy: str, tmp_path: Path, reference: Step, halves: Step,
        one_process: dict[str, Step], one_process_in_halves: dict[str, np.ndarray],
        halves_after: np.ndarray) -> None:
    variants = "off,all,1" if strategy == "horovod" else "off,all"
    proc = run_process([horovodrun(), "--gloo", "-np", "2", "-H", "localhost:2", *WORKER,
                        f"--strategy={strategy}", f"--variants={variants}", f"--out={tmp_path}"],
                       timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    if strategy == "horovod":
        _check_two_workers(tmp_path, reference, halves)
    _assert_statistics_equal_one_process(tmp_path, 2, one_process, one_process_in_halves,
                                         halves_after)


@pytest.mark.slow
def test_multiworker_two_workers_equal_one_process(
        tmp_path: Path, reference: Step, halves: Step, one_process: dict[str, Step],
        one_process_in_halves: dict[str, np.ndarray], halves_after: np.ndarray) -> None:
    log = io.StringIO()
    code = supervise([*WORKER, "--strategy=multiworker", "--variants=off,all,1",
                      f"--out={tmp_path}"], tf_config_envs(2), out=log)
    assert code == 0, log.getvalue()[-3000:]
    _check_two_workers(tmp_path, reference, halves)
    _assert_statistics_equal_one_process(tmp_path, 2, one_process, one_process_in_halves,
                                         halves_after)


def test_group_size_must_divide_the_replicas() -> None:
    assert [replica_groups(g, 4) for g in (0, 1, 2, 4)] == [1, 4, 2, 1]
    with pytest.raises(ValueError, match=r"--sync_bn_group=3 must divide the number of "
                                         r"replicas, 4"):
        replica_groups(3, 4)
    cfg = TrainConfig(model="resnet50_tiny", sync_bn=True, sync_bn_group=2)
    with pytest.raises(ValueError, match=r"--sync_bn_group=2 must divide .* replicas, 1"):
        synchronize_under_strategy(_bn_model(), DefaultStrategy(cfg), cfg)


def _bn_model() -> keras.Model:
    inner = keras.Sequential([keras.layers.Dense(4), keras.layers.BatchNormalization()])
    inputs = keras.Input((3,))
    return keras.Model(inputs, keras.layers.BatchNormalization()(inner(inputs)))


def test_nested_and_masked_batch_norm() -> None:
    model = _bn_model()
    assert synchronize_batch_norm(model, lambda t: t) == 2
    assert all("_moments" in vars(layer) for layer in batch_norm_layers(model))
    # With a mask, the moments are those of the unmasked positions, as Keras computes them.
    x = tf.random.stateless_normal((2, 5, 4), seed=(1, 2)) * 3 + 1
    layer = keras.layers.BatchNormalization()
    layer.build(x.shape)
    synchronize_batch_norm(layer, lambda t: t)
    mask = tf.constant([[True, True, False, True, False], [False, True, True, True, True]])
    for expected, got in zip(keras.layers.BatchNormalization._moments(layer, x, mask),
                             layer._moments(x, mask), strict=True):
        np.testing.assert_allclose(got.numpy(), expected.numpy(), atol=1e-5)


@pytest.mark.parametrize(("model", "flags"), [
    ("resnet50_tiny", {}), ("deeplabv3plus_tiny", {"num_classes": 3}),
    ("tiramisu_tiny", {"num_classes": 3})])
def test_every_batch_norm_layer_of_the_zoo_models(model: str, flags: dict[str, int],
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    import models

    cfg = TrainConfig(model=model, image_size=32, sync_bn=True, **flags)
    built = models.MODELS.get(model)(cfg)
    expected = sum(isinstance(layer, keras.layers.BatchNormalization)
                   for layer in built._flatten_layers())
    assert expected > 0
    assert synchronize_under_strategy(built, DefaultStrategy(cfg), cfg) == expected
    assert (f"--sync_bn: {expected} batch-norm layers compute their statistics over all 1 "
            "replica(s)") in capsys.readouterr().out


def test_refuses_xla_jit_where_collectives_cannot_be_compiled() -> None:
    horovod_like = type("ModelJit", (DefaultStrategy,), {"_jit_scope": "model"})
    cfg = TrainConfig(model="resnet50_tiny", sync_bn=True, xla="jit")
    with pytest.raises(ValueError, match=r"--sync_bn does not combine with --xla=jit"):
        synchronize_under_strategy(_bn_model(), horovod_like(cfg), cfg)


@pytest.mark.slow
def test_train_refuses_a_model_without_batch_norm(tmp_path: Path) -> None:
    proc = run_train(*TINY, "--dataset=synthetic", "--steps=1", "--sync_bn",
                     f"--model_dir={tmp_path}", timeout=120)
    assert proc.returncode != 0
    assert ("error: --sync_bn: --model=tiny_cnn has no batch-norm layers to synchronize"
            in proc.stderr), proc.stderr[-3000:]
    with pytest.raises(ValueError, match="has no BatchNormalization layer"):
        synchronize_batch_norm(tiny_cnn((8, 8, 3), 3), lambda t: t)


@pytest.mark.slow
@requires_horovod
def test_train_horovod_resnet_saves_a_plain_keras_model(tmp_path: Path) -> None:
    proc = run_train("--model=resnet50_tiny", "--dataset=synthetic", "--image_size=32",
                     "--num_classes=4", "--batch_size=2", "--steps=2", "--log_every=1",
                     "--tensorboard=false", "--strategy=horovod", "--num_processes=2",
                     "--sync_bn", f"--model_dir={tmp_path}", timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    line = re.search(r"--sync_bn: (\d+) batch-norm layers compute their statistics over all "
                     r"2 replica\(s\)", proc.stdout)
    assert line, proc.stdout[-3000:]
    assert np.isfinite(read_results(tmp_path)["final_loss"])
    loaded = keras.models.load_model(tmp_path / "model.keras")
    layers = batch_norm_layers(loaded)
    assert len(layers) == int(line.group(1))
    for layer in layers:
        assert type(layer) is keras.layers.BatchNormalization and not layer.synchronized
        assert "_moments" not in vars(layer)
    assert loaded(np.zeros((1, 32, 32, 3), np.float32), training=False).shape == (1, 4)
