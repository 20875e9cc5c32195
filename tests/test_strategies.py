"""mirrored and multiworker strategies with real processes: equivalence with one device."""

from __future__ import annotations

import io
import json
import os
import random
import socket
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    TINY,
    assert_exchange_share_logged,
    read_results,
    run_process,
    run_train,
)
from tests.equivalence import WORKER, assert_replicas_equal, load_weights, max_abs_diff, reference
from tfscale.scripts.launcher import supervise, tf_config_envs

pytestmark = pytest.mark.slow


def _mirrored(out: Path, steps: int, batch: int, *flags: str) -> list:
    proc = run_process([*WORKER, "--strategy=mirrored", "--cpu_replicas=2", f"--batch={batch}",
                        f"--steps={steps}", f"--out={out}", *flags], timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return load_weights(out / "rank0.npz")


def _multiworker(out: Path, steps: int, batch: int, *flags: str) -> list:
    log = io.StringIO()
    code = supervise([*WORKER, "--strategy=multiworker", f"--batch={batch}", f"--steps={steps}",
                      f"--out={out}", *flags], tf_config_envs(2), out=log)
    assert code == 0, log.getvalue()[-3000:]
    return assert_replicas_equal(out, 2)


def _multiworker_collectives(out: Path, steps: int, batch: int, *flags: str) -> list:
    weights = _multiworker(out, steps, batch, "--node_exchange=collectives", *flags)
    describe = json.loads((out / "rank0.json").read_text())["describe"]
    assert describe.endswith("gradients inside a node: gRPC (auto collectives)"), describe
    return weights


def _multiworker_shared_memory(out: Path, steps: int, batch: int, *flags: str) -> list:
    weights = _multiworker(out, steps, batch, "--node_exchange=shared_memory", *flags)
    counts = json.loads((out / "rank0.json").read_text())
    assert counts["describe"].endswith("gradients inside a node: shared memory"), counts["describe"]
    # A step's logged scalars stay the worker's own (MetricAverage averages the epoch's).
    assert counts["allreduces"] == steps, "per step, one exchange of the gradients"
    return weights


@pytest.mark.parametrize("run", [_mirrored, _multiworker_shared_memory,
                                 _multiworker_collectives],
                         ids=["mirrored", "multiworker", "multiworker-collectives"])
def test_one_step_equals_single_device_on_combined_batch(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    distributed = run(tmp_path / "dist", steps=1, batch=4)
    single = reference(tmp_path / "ref", batch=8)
    assert max_abs_diff(distributed, single) < 1e-5
    # The logged (epoch) loss is the workers' mean: the loss of the combined batch.
    logged = [json.loads((tmp_path / run / "rank0.json").read_text())["loss"]
              for run in ("dist", "ref")]
    assert logged[0] == pytest.approx(logged[1], abs=1e-5)


@pytest.mark.parametrize("run", [_mirrored, _multiworker], ids=["mirrored", "multiworker"])
def test_several_steps_stay_equivalent(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Two epochs of two steps against one epoch of four: over the epoch boundary model.fit goes
    # on with the same iterator (a multiworker worker iterates its own dataset there, see
    # tfscale.multiworker.per_worker_dataset), so step 3 reads the third batch, not the first.
    # With momentum: multiworker shards its update over the workers
    # (tfscale.exchange.sharded_update); the momentum, gathered as a checkpoint gathers it,
    # is one device's too.
    distributed = run(tmp_path / "dist", 4, 3, "--epochs=2", "--momentum=0.9")
    counts = json.loads((tmp_path / "dist" / "rank0.json").read_text())
    if run is _multiworker:
        # Every step's exchange sharded, and one more exchange: the momentum's gather.
        assert counts["sharded"] == counts["allreduces"] - 1 == 4, counts
        assert counts["describe"].endswith("SGD's momentum update sharded over 2 processes")
        momentum = assert_replicas_equal(tmp_path / "dist", 2, "_momentum")
    else:
        momentum = load_weights(tmp_path / "dist" / "rank0_momentum.npz")
    single = reference(tmp_path / "ref", batch=6, steps=4, momentum=0.9)
    assert max_abs_diff(distributed, single) < 1e-4
    assert max_abs_diff(momentum, load_weights(tmp_path / "ref" / "rank0_momentum.npz")) < 1e-4


@pytest.mark.parametrize("run", [_mirrored, _multiworker_shared_memory],
                         ids=["mirrored", "multiworker"])
def test_xla_jit_compiles_the_model_and_stays_equivalent(run, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # On CPU devices TensorFlow's XLA has no collectives and one step over several devices is
    # not one cluster: --xla=jit compiles each replica's model passes, the exchange runs outside
    # (compiling the whole step failed to run under both strategies).
    distributed = run(tmp_path / "dist", 2, 4, "--xla=jit")
    single = reference(tmp_path / "ref", batch=8, steps=2, xla="jit")
    assert max_abs_diff(distributed, single) < 1e-5


def test_train_cli_multiworker_and_mirrored(tmp_path: Path) -> None:
    # 2 validation batches of 4 per worker x 2 workers (multiworker), of 8 in one process
    # (mirrored): each evaluation covers 16 examples, counted once per process.
    # gRPC collectives: the strategy's own all-reduce, timed for the exchange's share.
    proc = run_train(*TINY, "--strategy=multiworker", "--num_processes=2", "--steps=3",
                     "--validation_steps=2", "--node_exchange=collectives",
                     "--tensorboard=true", f"--model_dir={tmp_path / 'mw'}")
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "INFO:tensorflow" not in proc.stdout
    results = read_results(tmp_path / "mw")
    assert results["num_workers"] == 2 and results["global_batch_size"] == 8
    assert [e["examples"] for e in results["evaluations"]] == [16]
    assert_exchange_share_logged(proc.stdout, tmp_path / "mw", [2, 3])
    # Mirrored with 2 micro-batches per step: Keras splits the process's 16 examples between
    # the replicas, each replica splits its 8 into micro-batches; evaluation is unchanged.
    proc = run_train(*TINY, "--strategy=mirrored", "--cpu_replicas=2", "--steps=3",
                     "--grad_accum_steps=2", "--validation_steps=2",
                     f"--model_dir={tmp_path / 'mirrored'}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = read_results(tmp_path / "mirrored")
    assert results["num_workers"] == 1 and results["replicas_per_worker"] == 2
    assert results["global_batch_size"] == 16 and results["steps"] == 3
    assert [e["examples"] for e in results["evaluations"]] == [16]


def test_multiworker_rejects_malformed_tf_config(tmp_path: Path) -> None:
    proc = run_train(*TINY, "--strategy=multiworker", "--steps=1", f"--model_dir={tmp_path}",
                     env={"TF_CONFIG": '{"cluster": {}}'})
    assert proc.returncode == 2
    assert "TF_CONFIG is malformed" in proc.stderr and "Traceback" not in proc.stderr


def _free_port_block(n: int) -> int:
    """A base port whose ``n`` ports from it are all free, below the kernel's ephemeral range:
    outgoing connections and other tests' ``free_ports`` draw from that range, and the port
    after a free one from it was once taken before the workers bound it."""
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    for _ in range(200):
        base = random.randrange(10000, low - n)
        sockets: list[socket.socket] = []
        try:
            for port in range(base, base + n):
                sockets.append(socket.socket())
                sockets[-1].bind(("", port))
            return base
        except OSError:
            continue
        finally:
            for sock in sockets:
                sock.close()
    raise RuntimeError(f"no {n} consecutive free ports in 10000-{low}")


def test_multiworker_cluster_from_simulated_slurm_step(tmp_path: Path) -> None:
    # The workers listen on TFSCALE_PORT_BASE + their local rank.
    slurm = {"SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "localhost",
             "SLURM_STEP_TASKS_PER_NODE": "2", "SLURM_NTASKS": "2",
             "TFSCALE_PORT_BASE": str(_free_port_block(2))}
    envs = [{**slurm, "SLURM_PROCID": str(r), "SLURM_LOCALID": str(r), "SLURM_NODEID": "0"}
            for r in range(2)]
    log = io.StringIO()
    code = supervise([*WORKER, "--strategy=multiworker", "--batch=4", "--steps=1",
                      f"--out={tmp_path}"], envs, out=log)
    assert code == 0, log.getvalue()[-3000:]
    assert max_abs_diff(assert_replicas_equal(tmp_path, 2), reference(tmp_path / "ref", 8)) < 1e-5


# Launchers' layouts: (ranks in the job, ranks on this node), as tfscale's launcher sets them.
ONE_NODE, TWO_NODES, ALONE = (2, 2), (4, 2), (1, 1)


@pytest.mark.parametrize(("flag", "preset", "gpu", "sync_bn", "layout", "extra", "expected"), [
    # CPU workers: Horovod wakes every 5 ms, not every 1, while it carries collectives...
    (-1.0, None, False, False, ALONE, {}, "5"),
    (-1.0, None, False, False, TWO_NODES, {}, "5"),
    (-1.0, None, False, False, ONE_NODE, {"node_exchange": "collectives"}, "5"),
    (-1.0, None, False, False, ONE_NODE, {"strategy": "ddl", "ddl_local_size": 1}, "5"),
    # Horovod's timeline keeps the gradients on Horovod (to record them), so 5 ms too.
    (-1.0, None, False, False, ONE_NODE, {"horovod_timeline": True}, "5"),
    # ...and every 50 ms on one node, where shared memory carries everything during training.
    (-1.0, None, False, False, ONE_NODE, {}, "50"),
    (-1.0, None, False, False, ONE_NODE, {"strategy": "ddl"}, "50"),
    (-1.0, None, True, False, ONE_NODE, {}, None),  # GPU workers: Horovod's own default
    (-1.0, None, False, True, ONE_NODE, {}, None),  # --sync_bn: a sum per layer, each a cycle
    (-1.0, "3", False, False, ONE_NODE, {}, "3"),   # the cluster's variable wins
    (20.0, "3", False, False, ONE_NODE, {}, "20"),  # the flag wins over everything
])
def test_horovod_cycle_time_default_fits_cpu_steps(
        flag: float, preset: str | None, gpu: bool, sync_bn: bool, layout: tuple[int, int],
        extra: dict[str, Any], expected: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
    from tfscale.config.train_config import TrainConfig
    from tfscale.strategies import horovod
    from tfscale.strategies.ddl import DDLStrategy

    monkeypatch.delenv("HOROVOD_CYCLE_TIME", raising=False)
    if preset is not None:
        monkeypatch.setenv("HOROVOD_CYCLE_TIME", preset)
    size, local_size = layout
    monkeypatch.setenv("TFSCALE_LOCAL_RANK", "0")
    monkeypatch.setenv("TFSCALE_LOCAL_SIZE", str(local_size))
    monkeypatch.setenv("HOROVOD_SIZE", str(size))
    monkeypatch.setattr(horovod, "_has_gpu", lambda: gpu)
    config = TrainConfig(**{"strategy": "horovod", "cycle_time_ms": flag, "sync_bn": sync_bn,
                            **extra})
    classes = {"horovod": horovod.HorovodStrategy, "ddl": DDLStrategy}
    classes[config.strategy](config).apply_environment()
    assert os.environ.get("HOROVOD_CYCLE_TIME") == expected


def test_one_worker_runs_under_the_default_strategy(monkeypatch: pytest.MonkeyPatch) -> None:
    # One worker with one device has nothing to exchange: no MultiWorkerMirroredStrategy (its
    # collectives on a group of one cost 23% of an mlp step), and Keras is left unpatched.
    import tensorflow as tf

    from tfscale.config.train_config import TrainConfig
    from tfscale.strategies import create, running
    from tfscale.strategies import keras_multiworker as keras_fix

    monkeypatch.delenv("TF_CONFIG", raising=False)
    with pytest.warns(UserWarning, match="without TF_CONFIG runs as a single worker"), \
            running(create(TrainConfig(model="tiny_cnn", strategy="multiworker"))) as strategy:
        assert strategy.tf_strategy is tf.distribute.get_strategy()
        assert not keras_fix.is_enabled()
        assert strategy.describe() == ("multiworker: 1 process(es) x 1 replica(s): one worker, "
                                       "nothing to exchange, so TensorFlow's default strategy")
        assert list(strategy.all_reduce([1.0, 3.0], "max")) == [1.0, 3.0]
        assert list(strategy.broadcast([2.0])) == [2.0]
