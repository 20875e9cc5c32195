"""The ``ddl`` strategy: topology, fused buffers and the DDL callback order in-process; the
hierarchical all-reduce, equivalence with one device, a DDL-style user script and the train CLI
with real processes on simulated nodes."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest
import tensorflow as tf

from tests.conftest import TINY, read_results, requires_horovod, run_process, run_train
from tests.equivalence import WORKER, assert_replicas_equal, load_weights, max_abs_diff, reference
from tfscale.callbacks import DDLGlobalVariablesBroadcast, DDLMetricSync, check_ddl_order
from tfscale.config.train_config import TrainConfig
from tfscale.exchange.fusion import fuse, unfuse
from tfscale.exchange.topology import Topology
from tfscale.strategies import STRATEGIES
from tfscale.strategies.ddl import DDLStrategy

NODES = [sys.executable, "-m", "tests.workers.simulated_nodes"]


def on_nodes(np_: int, per_node: int, *command: str, timeout: float = 240) -> Any:
    """Runs ``command`` as ``np_`` processes on simulated nodes of ``per_node``, bounded."""
    return run_process([*NODES, f"--np={np_}", f"--per_node={per_node}", "--", *command],
                       timeout=timeout)


# --- in-process -------------------------------------------------------------------------------

def test_topology_regular_and_from_launcher_placement() -> None:
    topo = Topology.regular(size=6, local_size=3, rank=4)
    assert topo.nodes == ((0, 1, 2), (3, 4, 5))
    assert (topo.node_index, topo.local_index) == (1, 1)
    assert topo.node_ranks == (3, 4, 5) and topo.cross_ranks == (1, 4)
    # Ranks dealt round-robin over two hosts (mpirun --map-by node): (cross rank, local rank).
    topo = Topology.from_placement([(0, 0), (1, 0), (0, 1), (1, 1)], rank=3)
    assert topo.nodes == ((0, 2), (1, 3))
    assert topo.node_ranks == (1, 3) and topo.cross_ranks == (2, 3)
    assert topo.describe() == "2 node(s) x 2 process(es)"


@pytest.mark.parametrize("build, message", [
    (lambda: Topology.regular(size=6, local_size=4, rank=0), "does not divide the job's 6"),
    (lambda: Topology.from_placement([(0, 0), (0, 1), (1, 0)], rank=0),
     "nodes of equal size.*--ddl_local_size"),
    (lambda: Topology.from_placement([(0, 0), (0, 0)], rank=0), "both claim local index 0"),
    (lambda: Topology.from_placement([(0, 0), (0, 2)], rank=0), r"local indices \[0, 2\]"),
])
def test_topology_rejects_uneven_or_inconsistent_layouts(build: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        build()


def test_fuse_pads_to_the_node_size_and_unfuse_restores_shapes() -> None:
    shapes = [(), (3,), (2, 5), (0,), (1, 1, 7)]
    tensors = [tf.reshape(tf.range(int(np.prod(s)), dtype=tf.float32) + 100 * i, s)
               for i, s in enumerate(shapes)]
    for multiple in (1, 2, 4, 7):
        buffer = fuse(tensors, multiple)
        assert buffer.shape[0] % multiple == 0 and buffer.shape[0] - 21 < multiple
        assert np.all(buffer.numpy()[21:] == 0)
        back = unfuse(buffer, tensors)
        assert [b.shape for b in back] == [t.shape for t in tensors]
        assert all(np.array_equal(b, t) for b, t in zip(back, tensors, strict=True))


def test_ddl_is_a_registered_horovod_style_strategy() -> None:
    assert STRATEGIES.get("ddl") is DDLStrategy
    assert DDLStrategy.rendezvous == "horovod"
    assert DDLStrategy(TrainConfig(strategy="ddl")).jit_scope == "model"


class RecordingComm:
    """One-process collectives that record what the callbacks ask for."""

    rank, size = 0, 1

    def __init__(self) -> None:
        self.calls: list[str] = []

    def all_reduce(self, values: Sequence[float] | np.ndarray, op: str = "mean") -> np.ndarray:
        self.calls.append("all_reduce")
        return np.asarray(values, dtype=np.float64)

    def broadcast_variables(self, variables: Sequence[keras.Variable], root: int = 0) -> None:
        self.calls.append("broadcast")


def _fit(callbacks: list[keras.callbacks.Callback]) -> keras.callbacks.History:
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model.fit(np.ones((4, 3)), np.ones((4, 2)), batch_size=2, epochs=2, verbose=0,
                     callbacks=callbacks)


def test_ddl_pair_in_order_syncs_and_broadcasts_once() -> None:
    comm = RecordingComm()
    _fit([DDLMetricSync(comm), keras.callbacks.TerminateOnNaN(), DDLGlobalVariablesBroadcast(comm)])
    assert comm.calls == ["broadcast", "all_reduce", "all_reduce"]


class LoggingBroadcast(DDLGlobalVariablesBroadcast):
    """A user's subclass whose hook calls super(): the order is still found."""

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        super().on_train_begin(logs)


@pytest.mark.parametrize("order, message", [
    ("sync_late", "DDLMetricSync is at position 1 but must be the first callback"),
    ("broadcast_early", "DDLGlobalVariablesBroadcast is at position 0 of 3 but must be the last"),
    ("subclass_early", "DDLGlobalVariablesBroadcast is at position 1 of 3"),
    ("sync_alone_late", "DDLMetricSync is at position 1"),
])
def test_wrong_ddl_order_fails_in_fit_before_any_collective(order: str, message: str) -> None:
    comm = RecordingComm()
    user = keras.callbacks.TerminateOnNaN()
    sync, broadcast = DDLMetricSync(comm), DDLGlobalVariablesBroadcast(comm)
    callbacks = {
        "sync_late": [user, sync, broadcast],
        "broadcast_early": [broadcast, sync, user],
        "subclass_early": [sync, LoggingBroadcast(comm), user],
        "sync_alone_late": [user, sync],
    }[order]
    with pytest.raises(ValueError, match=message) as err:
        _fit(callbacks)
    assert comm.calls == []
    assert "pass callbacks=[DDLMetricSync(), TerminateOnNaN(...)" in str(err.value)


def test_check_ddl_order_names_the_fix_and_ignores_keras_own_callbacks() -> None:
    sync, broadcast = DDLMetricSync(RecordingComm()), DDLGlobalVariablesBroadcast(RecordingComm())
    csv = keras.callbacks.CSVLogger("unused.csv")
    check_ddl_order([sync, csv, broadcast, keras.callbacks.History(),
                     keras.callbacks.ProgbarLogger()])
    check_ddl_order([csv])
    with pytest.raises(ValueError) as err:
        check_ddl_order([broadcast, csv, sync])
    text = str(err.value)
    assert "Got callbacks=[DDLGlobalVariablesBroadcast, CSVLogger, DDLMetricSync]" in text
    assert text.endswith(
        "pass callbacks=[DDLMetricSync(), CSVLogger(...), DDLGlobalVariablesBroadcast()]")
    assert "every later callback sees metrics averaged" in text
    with pytest.raises(ValueError, match=r"DDLMetricSync appears 2 times \(at positions \[0, 2\]"):
        check_ddl_order([sync, csv, DDLMetricSync(RecordingComm()), broadcast])


# --- real processes on simulated nodes ---------------------------------------------------------

LAYOUTS = {"2x1": (2, 1), "1x2": (2, 2), "2x2": (4, 2)}


@pytest.mark.slow
@requires_horovod
@pytest.mark.parametrize("layout, exchange", [
    ("2x1", "auto"), ("1x2", "auto"), ("2x2", "auto"), ("1x2", "collectives"),
    ("2x2", "collectives")])
def test_hierarchical_all_reduce_matches_flat_all_reduce(layout: str, exchange: str,
                                                         tmp_path: Path) -> None:
    np_, per_node = LAYOUTS[layout]
    proc = on_nodes(np_, per_node, sys.executable, "-m", "tests.workers.hierarchical",
                    f"--out={tmp_path}", f"--node_exchange={exchange}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    nodes = [list(range(s, s + per_node)) for s in range(0, np_, per_node)]
    for rank in range(np_):
        result = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert result["nodes"] == nodes, "nodes found from the launcher's host names"
        # This CPU-only x86-64 machine: the node phases run in shared memory unless told not.
        assert result["node_transport"] == (
            "" if per_node == 1 else "Horovod collectives" if exchange == "collectives"
            else "shared memory")
        # ... as tfscale's ops in a step, not host calls: the whole all-reduce on one node,
        # the reduce-scatter and all-gather around the cross-node sum on several.
        assert result["node_ops"] == (
            [] if per_node == 1 or exchange == "collectives"
            else ["TfscaleNodeAllReduce"] if np_ == per_node
            else ["TfscaleNodeAllGather", "TfscaleNodeReduceScatter"]), result["node_ops"]
        # Integer-valued sums are exact in any order: bit-identical to Horovod's flat sums,
        # fused, one tensor at a time (sizes 1, 3, 35, 13, 7) and with float16 on the wire.
        for key in ("exact_vs_flat", "exact_alone_vs_flat", "exact_fp16_vs_flat"):
            assert result[key] == 0.0, (key, result)
        for key in ("fused_vs_flat", "fused_vs_numpy", "alone_vs_numpy", "graph_vs_numpy",
                    "mean_vs_numpy"):
            assert result[key] < 1e-5, (key, result)
        assert result["dtypes_kept"]


@pytest.fixture(scope="module")
def references(tmp_path_factory: pytest.TempPathFactory) -> dict[int, list[np.ndarray]]:
    """Single-device weights on the combined batch: after 1 step of 8 and 4 steps of 6."""
    out = tmp_path_factory.mktemp("reference")
    return {1: reference(out / "one", batch=8), 4: reference(out / "four", batch=6, steps=4)}


def _ddl_workers(out: Path, layout: str, steps: int, batch: int) -> list[np.ndarray]:
    np_, per_node = LAYOUTS[layout]
    # 2x1 regroups ranks with --ddl_local_size; 1x2 takes its node from the host names.
    regroup = ["--ddl_local_size=1"] if layout == "2x1" else []
    proc = on_nodes(np_, per_node, *WORKER, "--strategy=ddl", f"--batch={batch}",
                    f"--steps={steps}", f"--out={out}", *regroup)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return assert_replicas_equal(out, np_)


@pytest.mark.slow
@requires_horovod
@pytest.mark.parametrize("layout", ["2x1", "1x2"])
def test_one_step_equals_single_device_on_combined_batch(
        layout: str, tmp_path: Path, references: dict[int, list[np.ndarray]]) -> None:
    distributed = _ddl_workers(tmp_path, layout, steps=1, batch=4)
    assert max_abs_diff(distributed, references[1]) < 1e-5


@pytest.mark.slow
@requires_horovod
@pytest.mark.parametrize("layout", ["2x1", "1x2"])
def test_learners_stay_identical_over_several_steps(
        layout: str, tmp_path: Path, references: dict[int, list[np.ndarray]]) -> None:
    distributed = _ddl_workers(tmp_path, layout, steps=4, batch=3)
    assert max_abs_diff(distributed, references[4]) < 1e-4


@pytest.mark.slow
@requires_horovod
def test_user_fit_script_with_the_ddl_pair(tmp_path: Path) -> None:
    proc = on_nodes(2, 1, sys.executable, "-m", "tests.workers.ddl_fit", f"--out={tmp_path}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    w0, w1 = (load_weights(tmp_path / f"rank{r}.npz") for r in (0, 1))
    assert max_abs_diff(w0, w1) == 0.0, "the broadcast, last, overrode the rank-shifted weights"
    r0, r1 = (json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1))
    assert r0["local_loss"] != r1["local_loss"], "learners read different data"
    assert r0["history"] == r1["history"], "History holds losses averaged over the learners"

    proc = on_nodes(2, 1, sys.executable, "-m", "tests.workers.ddl_fit", "--order=wrong",
                    f"--out={tmp_path / 'wrong'}")
    assert proc.returncode != 0
    assert "DDLGlobalVariablesBroadcast is at position 1 of 3 but must be the last" in proc.stdout
    assert "pass callbacks=[DDLMetricSync(), ShiftWeightsByRank(...), " \
           "DDLGlobalVariablesBroadcast()]" in proc.stdout


@pytest.mark.slow
@requires_horovod
def test_train_cli_on_two_simulated_nodes(tmp_path: Path) -> None:
    proc = run_train(*TINY, "--strategy=ddl", "--num_processes=2", "--ddl_local_size=1",
                     "--steps=3", "--lr_scaling=linear", f"--model_dir={tmp_path}")
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "ddl: 2 learner(s) on 2 node(s) x 1 process(es), hierarchical all-reduce (across " \
           "nodes: Horovod (Gloo)); learning rate x2 (--lr_scaling=linear)" in proc.stdout
    results = read_results(tmp_path)
    assert results["num_workers"] == 2 and results["global_batch_size"] == 8
    assert results["steps"] == 3 and np.isfinite(results["final_loss"])
