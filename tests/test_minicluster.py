"""Two real nodes on this machine (launch.minicluster): job scripts as generated, under Slurm.

One cluster serves the module (``up`` once, ``down`` at the end, also when a test fails). The
nodes are Linux namespaces with their own host name, address and /dev/shm; where this machine
cannot make namespaces (not root, a sandbox), every test here skips and says why.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import launch.minicluster as minicluster
from tests.conftest import ROOT, run_process
from tests.equivalence import WORKER, assert_replicas_equal, max_abs_diff, reference
from tests.faults import wait_for

pytestmark = [pytest.mark.slow, pytest.mark.cluster]
CLUSTER = [sys.executable, "-m", "launch.minicluster"]
WHY_NOT = minicluster.why_not_possible()
needs_namespaces = pytest.mark.skipif(bool(WHY_NOT), reason=WHY_NOT or "")


def _on_cluster(*command: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return run_process([*CLUSTER, "exec", *command], timeout=timeout)


@needs_namespaces
def test_down_after_an_up_that_failed_halfway_leaves_nothing() -> None:
    """Namespaces, holders and munge started, then the start-up stops: ``down`` finds all of
    it by name and removes it (no namespace, process, mount or state directory left).

    As ``up`` does, the packages come first: the holders bind the cluster's configuration
    over /etc/slurm and /etc/ssh/ssh_config, which exist only once Slurm and OpenSSH are
    installed (on a fresh machine this test may be the first to need them)."""
    from launch.minicluster import _daemons, _layout, _namespaces, _packages

    assert not _namespaces.existing_netns(), "a cluster is already up; run down first"
    _packages.ensure(lambda _: None)
    head, nodes = _layout.head((0,)), _layout.nodes(2, [(0,), (0,)])
    try:
        _daemons.write_configuration(head, nodes, cpus_per_node=1)
        _namespaces.create_network(head, nodes)
        for host in (head, *nodes):
            _namespaces.start_holder(host, _daemons.binds(host, host is head))
        assert len(_namespaces.processes_in(_namespaces.existing_netns())) >= 3
    finally:
        left = minicluster.down(lambda _: None)
    assert left == [] and minicluster.leftovers() == []


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    if WHY_NOT:
        pytest.skip(WHY_NOT)
    up = run_process([*CLUSTER, "up", "--nodes=2"], timeout=600)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        assert "submit with:" in up.stdout
        again = run_process([*CLUSTER, "up", "--nodes=2"], timeout=120)
        assert again.returncode == 0 and "already up: node1, node2" in again.stdout
        status = run_process([*CLUSTER, "status"], timeout=60)
        assert status.returncode == 0, status.stdout + status.stderr
        assert "node1" in status.stdout and "idle" in status.stdout
        yield
    finally:
        down = run_process([*CLUSTER, "down"], timeout=120)
        assert down.returncode == 0 and "nothing left behind" in down.stdout, down.stdout
        assert minicluster.leftovers() == []


@pytest.mark.usefixtures("cluster")
def test_nodes_are_separate_hosts_with_their_own_dev_shm(tmp_path: Path) -> None:
    marker = Path("/dev/shm") / f"tfscale-test-{tmp_path.name}"
    marker.write_text("host")
    try:
        proc = _on_cluster("srun", "-N2", "--ntasks-per-node=1", "sh", "-c",
                           f'echo "$(hostname) $(test -e {marker} && echo sees || echo own)"')
    finally:
        marker.unlink()
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split("\n")[:2]) == ["node1 own", "node2 own"], proc.stdout
    outside = _on_cluster("sh", "-c", "ip route get 1.1.1.1", timeout=30)
    assert outside.returncode != 0, "the cluster's namespaces must have no route out"


SHARED_MPI = "inside a node: shared memory; across nodes: Horovod (MPI)"
ALL_SCRIPTS = pytest.mark.skipif(os.environ.get("TFSCALE_CLUSTER_ALL") != "1",
                                 reason="runs with TFSCALE_CLUSTER_ALL=1 (CI time; ddl across "
                                        "nodes is the mpirun case's Horovod over MPI)")


@pytest.mark.usefixtures("cluster")
@pytest.mark.parametrize("launcher, strategy, exchange", [
    ("slurm", "multiworker", "inside a node: shared memory; across nodes: TCP (tfscale's "
                             "ring)"),
    # ddl across nodes is Horovod over MPI, as the mpirun case and the requeue test (Slurm) run
    # it; its own script runs with TFSCALE_CLUSTER_ALL=1.
    pytest.param("slurm", "ddl", SHARED_MPI, marks=ALL_SCRIPTS),
    ("mpirun", "horovod", SHARED_MPI),
    ("horovodrun", "horovod", "inside a node: shared memory; across nodes: Horovod (Gloo)"),
])
def test_generated_job_script_runs_across_two_nodes(launcher: str, strategy: str,
                                                    exchange: str, tmp_path: Path) -> None:
    """The script as launch.jobscript writes it: under sbatch, or started on node1 as a user
    of an allocation would (mpirun and horovodrun reach node2 over ssh). Slurm with horovod
    runs in the requeue test below."""
    script, model_dir = _job_script(tmp_path, launcher, strategy, "--steps=2")
    if launcher == "slurm":
        # Slurm's own log goes to tmp_path (an sbatch option overrides the script's --output).
        shown = _finished(_submit(script, f"{tmp_path}/slurm-%j.out"), tmp_path)
        assert "JobState=COMPLETED" in shown and "ExitCode=0:0" in shown, shown + _logs(tmp_path)
    else:
        job = _on_cluster("--on", "node1", "bash", str(script))
        assert job.returncode == 0, job.stdout + job.stderr + _logs(tmp_path)
    _check_results(model_dir, exchange)
    assert exchange in next((tmp_path / "logs").rglob("rank-0.log")).read_text()


def _job_script(tmp_path: Path, launcher: str, strategy: str, *train: str) -> tuple[Path, Path]:
    """launch.jobscript's script for 2 nodes x 2 ranks of mlp, and its model_dir."""
    script, model_dir = tmp_path / "job.sh", tmp_path / "run"
    where = ["--nodes=2"] if launcher == "slurm" else ["-H", "node1:2,node2:2"]
    made = run_process([sys.executable, "-m", "launch.jobscript", launcher, *where,
                        "--ranks_per_node=2", "--gpus_per_node=0", "--time=00:10:00",
                        f"--log_dir={tmp_path / 'logs'}", f"--job_name=t-{strategy}",
                        "-o", str(script), "--", "--model=mlp", "--image_size=16",
                        f"--strategy={strategy}", "--batch_size=8", *train,
                        "--tensorboard=false", f"--model_dir={model_dir}"], timeout=60)
    assert made.returncode == 0, made.stderr
    return script, model_dir


def _submit(script: Path, output: str) -> str:
    """Submits ``script`` with sbatch; returns the job id."""
    submitted = _on_cluster("sbatch", "--parsable", f"--output={output}", str(script))
    assert submitted.returncode == 0, submitted.stdout + submitted.stderr
    return submitted.stdout.strip().split(";")[0]


def _finished(job_id: str, logs: Path, timeout: float = 300) -> str:
    """``scontrol show job`` once job ``job_id`` has left the queue (the cluster keeps its
    record for MinJobAge, 300 s). Polled each second: ``sbatch --wait`` polls after 2, 10, 42
    s and then every 32 s, so a job of 20 s returned after 42."""
    deadline = time.monotonic() + timeout
    while _on_cluster("squeue", "-h", "-j", job_id, "-o", "%T").stdout.strip():
        assert time.monotonic() < deadline, _logs(logs)
        time.sleep(1)
    return _on_cluster("scontrol", "show", "job", job_id).stdout


def _logs(tmp_path: Path) -> str:
    return "\n".join(p.read_text()[-1500:] for p in sorted(tmp_path.rglob("*.log")))


def _check_results(model_dir: Path, exchange: str) -> dict[str, object]:
    results = json.loads((model_dir / "results.json").read_text())
    assert results["num_workers"] == 4
    assert results["hosts"] == ["node1", "node1", "node2", "node2"]
    assert results["exchange"] == exchange
    return results


@pytest.mark.usefixtures("cluster")
def test_time_limit_warning_checkpoints_requeues_and_resumes_to_the_same_weights(
        tmp_path: Path) -> None:
    """A Slurm horovod job gets the time-limit warning (SIGUSR1, as its --signal asks) before
    its last step: every rank checkpoints and stops, the script requeues the job, and the
    second attempt resumes to the same weights as an uninterrupted run (< 1e-6).

    The warning is made to land before the end at any CPU speed: once every rank catches
    SIGUSR1 (tfscale.cluster.preemption, installed before TensorFlow loads), the ranks are stopped,
    Slurm sends the signal, and they go on only when each holds it pending; the guard then
    stops them at the first step."""
    train = ("--steps=40", "--log_every=1", "--deterministic")
    whole_script, whole = _job_script(tmp_path / "whole", "slurm", "horovod", *train)
    shown = _finished(_submit(whole_script, f"{tmp_path}/whole-%j.out"), tmp_path / "whole")
    assert "JobState=COMPLETED" in shown, shown + _logs(tmp_path / "whole")
    script, model_dir = _job_script(tmp_path / "cut", "slurm", "horovod", *train)
    text = script.read_text()
    assert "#SBATCH --signal=USR1@150" in text and "#SBATCH --requeue" in text
    job_id = _submit(script, f"{tmp_path}/cut-%j.out")
    first = tmp_path / "cut" / "logs" / f"t-horovod-{job_id}"
    ranks: list[int] = []

    def catching() -> bool:
        ranks[:] = _training_processes(model_dir)
        return len(ranks) == 4 and all(_signal_mask(pid, "SigCgt") & USR1 for pid in ranks)

    wait_for(catching, 180, f"4 ranks catching SIGUSR1\n{_logs(tmp_path / 'cut')}")
    for pid in ranks:
        os.kill(pid, signal.SIGSTOP)
    try:
        assert "step 40/" not in _read(first / "rank-0.log")
        assert _on_cluster("scancel", "--signal=USR1", job_id).returncode == 0
        wait_for(lambda: all((_signal_mask(pid, "SigPnd") | _signal_mask(pid, "ShdPnd")) & USR1
                             for pid in ranks), 60, "SIGUSR1 pending on every rank")
    finally:
        for pid in ranks:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    shown = _finished(job_id, tmp_path / "cut")
    assert "JobState=COMPLETED" in shown and "Restarts=1" in shown, shown
    assert sorted(_read(first / "preempted").split("\n")[:4]) == [
        "rank 0", "rank 1", "rank 2", "rank 3"]
    assert "preempted by a signal at step" in _read(first / "rank-0.log")
    resumed = _read(first.with_name(f"{first.name}-restart1") / "rank-0.log")
    assert "steps 0->40" not in resumed and "->40;" in resumed, resumed[-2000:]
    assert _check_results(model_dir, SHARED_MPI)["steps"] == 40
    _check_results(whole, SHARED_MPI)
    a = np.load(model_dir / "checkpoints" / "ckpt-000000040.npz")
    b = np.load(whole / "checkpoints" / "ckpt-000000040.npz")
    assert max(float(np.max(np.abs(a[k] - b[k]))) for k in a.files) < 1e-6


USR1 = 1 << (signal.SIGUSR1 - 1)


def _training_processes(model_dir: Path) -> list[int]:
    """The pids of the tfscale.train processes writing into ``model_dir`` (the nodes share
    this machine's process table: their namespaces are network, host name and mounts)."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"tfscale.train" in argv and f"--model_dir={model_dir}".encode() in argv:
            found.append(int(entry.name))
    return found


def _signal_mask(pid: int, field: str) -> int:
    """A signal mask (SigCgt, SigPnd, ShdPnd ...) of ``pid`` from /proc (0 once it is gone)."""
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return 0
    line = next((x for x in text.splitlines() if x.startswith(f"{field}:")), f"{field}: 0")
    return int(line.split()[1], 16)


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


GRPC = "inside a node: gRPC (auto collectives); across nodes: gRPC (auto collectives)"
SHARED_RING = "inside a node: shared memory; across nodes: TCP (tfscale's ring)"
# CI runs the hierarchical cases (shared memory + MPI, shared memory + gRPC) and the gRPC
# case; TFSCALE_CLUSTER_ALL=1 runs every strategy x mode (ddl's hierarchy is horovod's across
# nodes, and its Horovod process sets are tested on simulated nodes in test_ddl).
ALL = pytest.mark.skipif(os.environ.get("TFSCALE_CLUSTER_ALL") != "1",
                         reason="the full strategy x --node_exchange matrix runs with "
                                "TFSCALE_CLUSTER_ALL=1 (CI runs three of its nine cases)")


@pytest.mark.usefixtures("cluster")
@pytest.mark.parametrize("strategy, exchange, transport", [
    ("horovod", "auto", SHARED_MPI),
    ("multiworker", "collectives", GRPC),
    ("multiworker", "shared_memory", SHARED_RING),
    pytest.param("ddl", "shared_memory", SHARED_MPI, marks=ALL),
    pytest.param("ddl", "collectives",
                 "inside a node: Horovod (MPI); across nodes: Horovod (MPI)", marks=ALL),
    pytest.param("horovod", "shared_memory", SHARED_MPI, marks=ALL),
    pytest.param("horovod", "collectives",
                 "inside a node: Horovod (MPI); across nodes: Horovod (MPI)", marks=ALL),
    pytest.param("ddl", "auto", SHARED_MPI, marks=ALL),
    pytest.param("multiworker", "auto", SHARED_RING, marks=ALL),
])
def test_two_nodes_of_two_equal_one_process_on_the_combined_batch(
        strategy: str, exchange: str, transport: str, tmp_path: Path) -> None:
    """2 nodes x 2 ranks, 2 steps, against one process on the 4 x 4 batch (< 1e-5)."""
    mpi = ["--mpi=pmix"] if strategy != "multiworker" else []
    run = _on_cluster("srun", "-N2", "--ntasks-per-node=2", *mpi, "--kill-on-bad-exit=1",
                      *WORKER, f"--strategy={strategy}", "--steps=2", "--batch=4",
                      f"--node_exchange={exchange}", f"--out={tmp_path / 'dist'}")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    distributed = assert_replicas_equal(tmp_path / "dist", 4)
    assert max_abs_diff(reference(tmp_path / "ref", 16, steps=2), distributed) < 1e-5
    describe = json.loads((tmp_path / "dist" / "rank0.json").read_text())["describe"]
    assert transport in describe, describe


@pytest.mark.usefixtures("cluster")
def test_link_time_writes_the_calls_a_step_makes_across_two_nodes(tmp_path: Path) -> None:
    """``tfscale.cli.link_time`` under srun, 2 nodes x 2 ranks: it times Horovod's grouped
    call and multiworker's whole hierarchical exchange (the shared-memory node phases around
    one tfscale ring per local index, its sum checked on every rank first: a wrong one exits
    non-zero) at mlp's gradient bytes, and writes both for that shape into a copy of the
    machine file, which the forecast then charges a multiworker hierarchical 2x2 plan."""
    from bench.shaped_links import on_both_nodes
    from tfscale.forecast import machines
    from tfscale.forecast.predict import Plan, forecast

    out = tmp_path / "cluster.json"
    found = on_both_nodes("tfscale.cli.link_time", "--machine=minicluster_25gbit",
                          "--model=mlp", f"--out={out}", "--seconds=0.05", local=2,
                          timeout=240)
    machine = machines.load(str(out))
    gradient_bytes = machine.model("mlp").gradient_bytes
    assert (found["nodes"], found["ranks_per_node"]) == (2, 2), found
    assert gradient_bytes - 4 * 8 < found["bytes"] <= gradient_bytes, found
    assert machine.flat_call_GBps == {(2, 2): found["flat_calls"]}
    assert machine.hierarchical_call_GBps == {(2, 2): found["hierarchical_calls"]}
    assert found["hierarchical_ms"] > 0 and found["flat_ms"] > 0, found
    sources = [entry[0]["source"] for key, entry in machine.raw["inter_node"].items()
               if key.endswith("_calls")]
    assert "Horovod's grouped all-reduce (MPI)" in sources[0], sources
    assert "multiworker's hierarchical exchange" in sources[1], sources
    row = forecast(Plan(machine, "mlp", "fp32", 64, 2, (("algorithm", "hierarchical"),
                                                         ("fp16", False)),
                        strategy="multiworker"), [2])[0]
    assert row.terms_ms["bandwidth"] + row.terms_ms["latency"] == pytest.approx(
        1e3 * 1.5 * gradient_bytes / (found["hierarchical_calls"] * 1e9))


def test_the_cluster_module_answers_without_a_cluster() -> None:
    proc = run_process([*CLUSTER, "--help"], timeout=60, cwd=ROOT)
    assert proc.returncode == 0 and "up --nodes=2" in proc.stdout


@pytest.mark.usefixtures("cluster")
@pytest.mark.parametrize("strategy", [
    "horovod",
    # Across nodes over tfscale's TCP ring (tfscale.exchange.socket_ring).
    pytest.param("multiworker", marks=ALL),
])
def test_a_cut_link_stops_every_rank_on_every_node_with_the_checkpoint_intact(
        strategy: str, tmp_path: Path) -> None:
    """node2's link goes down mid-run (ip link set down): the ranks on both nodes are stuck in
    a collective that has no timeout of its own; each exits within --collective_timeout_s +
    30 s with EXIT_PEER_LOST (4), none is left on either node, and the last checkpoint
    loads."""
    from launch.minicluster._layout import nodes as cluster_nodes

    timeout_s = 10
    script, model_dir = _job_script(tmp_path, "slurm", strategy, "--steps=2000",
                                    "--log_every=1", "--checkpoint_every=5",
                                    f"--collective_timeout_s={timeout_s}")
    job_id = _submit(script, f"{tmp_path}/job-%j.out")
    log = tmp_path / "logs" / f"t-{strategy}-{job_id}" / "rank-0.log"
    deadline = time.monotonic() + 180
    while "step 12/" not in _read(log):
        assert time.monotonic() < deadline, _logs(tmp_path)
        time.sleep(0.5)
    node1, node2 = cluster_nodes(2, [(0,), (0,)])
    subprocess.run(["ip", "-n", node2.netns, "link", "set", "eth0", "down"], check=True)
    cut = time.monotonic()
    try:
        while _ranks_on(node1.netns, node2.netns):
            assert time.monotonic() - cut < timeout_s + 30, (
                f"ranks still running {timeout_s + 30} s after the cut: "
                f"{_ranks_on(node1.netns, node2.netns)}")
            time.sleep(0.5)
    finally:
        subprocess.run(["ip", "-n", node2.netns, "link", "set", "eth0", "up"], check=True)
    logs = [_read(p) for p in sorted(log.parent.glob("rank-*.log"))]
    # The step watchdog's message, or (multiworker) the one for TensorFlow's collectives that
    # its peer health check aborts: both exit with EXIT_PEER_LOST.
    assert len(logs) == 4 and all("a peer or its link is lost" in text
                                  or "error: lost contact with" in text for text in logs), logs
    shown = _finished(job_id, tmp_path, timeout=60)
    assert "ExitCode=4:0" in shown, shown
    newest = sorted((model_dir / "checkpoints").glob("ckpt-*.npz"))[-1]
    with np.load(newest) as checkpoint:
        assert all(np.isfinite(checkpoint[k]).all() for k in checkpoint.files)


def _ranks_on(*netns: str) -> list[int]:
    """The tfscale.train processes in these network namespaces (the nodes share a pid space, so
    a name alone would also match the other node's)."""
    from launch.minicluster._namespaces import processes_in

    return [pid for pid in processes_in(list(netns))
            if b"tfscale.train" in _cmdline(pid)]


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""
