"""The one owner of "which processes share a node": tfscale.exchange.placement."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import ROOT, requires_horovod
from tests.equivalence import WORKER, assert_replicas_equal, max_abs_diff, reference
from tfscale.exchange import placement, shared_memory

TWO_NODES = [[0, 1], [2, 3]]


@pytest.fixture(autouse=True)
def _x86(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shared_memory.platform, "machine", lambda: "x86_64")


def test_nodes_of_one_domain_each_take_shared_memory() -> None:
    plan = placement.plan_exchange("shared_memory", TWO_NODES, ["a", "a", "b", "b"], "gRPC")
    assert plan.shared_memory
    assert plan.describe() == "inside a node: shared memory; across nodes: gRPC"


def test_a_node_whose_processes_see_different_dev_shm_never_takes_shared_memory() -> None:
    # Equal host names put ranks 0 and 1 on one "node", but their /dev/shm differ.
    domains = ["a", "b", "c", "c"]
    with pytest.raises(ValueError, match=r"node 0 of the launcher's layout \(ranks \[0, 1\]\) "
                                         r"spans 2 different /dev/shm"):
        placement.plan_exchange("shared_memory", TWO_NODES, domains, "Horovod (MPI)")
    fallback = placement.plan_exchange("collectives", TWO_NODES, domains, "Horovod (MPI)")
    assert not fallback.shared_memory and fallback.inside == "Horovod (MPI)"


def test_auto_falls_back_and_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(placement, "use_shared_memory", lambda mode, local: True)
    plan = placement.plan_exchange("auto", [[0, 1, 2, 3]], ["a", "a", "b", "b"], "Horovod (Gloo)")
    assert not plan.shared_memory
    assert plan.describe().startswith("inside a node: Horovod (Gloo) (no shared memory: node 0")


def test_one_process_per_node_has_no_node_phase() -> None:
    plan = placement.plan_exchange("shared_memory", [[0], [1]], ["a", "b"], "gRPC")
    assert not plan.shared_memory and plan.describe() == "across nodes: gRPC"


def test_gather_strings_through_a_sum() -> None:
    names = ["node1", "node-two", "n3"]
    tables = []

    def capture(values: np.ndarray) -> np.ndarray:
        tables.append(values)
        return values

    for rank, name in enumerate(names):
        placement.gather_strings(name, rank, 3, capture)
    total = sum(tables)
    assert placement.gather_strings("node1", 0, 3, lambda _: total) == names


def test_shm_domain_differs_in_a_private_dev_shm() -> None:
    """A process in its own mount namespace with a tmpfs of its own on /dev/shm is another
    shared-memory domain, whatever its host name; this process's is stable."""
    here = placement.shm_domain()
    assert here == placement.shm_domain()
    probe = subprocess.run(["unshare", "--mount", "true"], capture_output=True, check=False)
    if probe.returncode:
        pytest.skip(f"cannot make a mount namespace here: {probe.stderr.decode().strip()}")
    code = ("from tfscale.exchange.placement import shm_domain; print(shm_domain())")
    other = subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c",
         f"mount -t tmpfs tmpfs /dev/shm && exec {sys.executable} -c '{code}'"],
        capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    assert other and other != here


@requires_horovod
def test_equal_host_names_with_different_dev_shm_stay_off_shared_memory(tmp_path: Path) -> None:
    """Two Horovod ranks that both call themselves "localhost" (one node to the launcher), the
    second in a mount namespace with a /dev/shm of its own: shared memory cannot join them, so
    the gradients go through Gloo and the step still equals one process's on the combined batch
    (before the domains were compared, both waited for a peer in their own /dev/shm)."""
    if subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode:
        pytest.skip("cannot make a mount namespace here (needs root)")
    from tfscale.scripts.launcher import horovod_envs

    envs, server = horovod_envs([("localhost", 2)])
    procs = []
    try:
        for rank, env in enumerate(envs):
            command = [*WORKER, "--strategy=horovod", "--steps=1", "--batch=4",
                       f"--out={tmp_path / 'hvd'}"]
            if rank == 1:
                command = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                           'mount -t tmpfs tmpfs /dev/shm && exec "$@"', "sh", *command]
            procs.append(subprocess.Popen(
                command, cwd=ROOT, env={**os.environ, **env, "PYTHONUNBUFFERED": "1"},
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True))
        outputs = [p.communicate(timeout=150)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        server.stop()
    assert [p.returncode for p in procs] == [0, 0], "\n".join(o[-2000:] for o in outputs)
    distributed = assert_replicas_equal(tmp_path / "hvd", 2)
    assert max_abs_diff(reference(tmp_path / "ref", 8), distributed) < 1e-5
    describe = json.loads((tmp_path / "hvd" / "rank0.json").read_text())["describe"]
    assert ("inside a node: Horovod (Gloo) (no shared memory: node 0 of the launcher's layout "
            "(ranks [0, 1]) spans 2 different /dev/shm") in describe, describe
