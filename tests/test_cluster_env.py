"""tfscale.cluster.environment: launcher variables -> rank, sizes, hosts and the TF cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tfscale.cluster import environment as cluster_env
from tfscale.cluster.environment import ClusterEnv, detect, expand_hostlist, tf_config_from_slurm


def slurm_task(rank: int, local_rank: int, node: int, **extra: str) -> dict[str, str]:
    """The variables srun gives task ``rank`` of a 6-task step on node[01-02],gpu5 (2 each)."""
    hosts = ["node01", "node02", "gpu5"]
    return {"SLURM_JOB_NODELIST": "node[01-02],gpu5", "SLURM_STEP_NODELIST": "node[01-02],gpu5",
            "SLURM_NTASKS": "6", "SLURM_STEP_NUM_TASKS": "6", "SLURM_TASKS_PER_NODE": "2(x3)",
            "SLURM_STEP_TASKS_PER_NODE": "2(x3)", "SLURM_PROCID": str(rank),
            "SLURM_LOCALID": str(local_rank), "SLURM_NODEID": str(node),
            "SLURMD_NODENAME": hosts[node], **extra}


@pytest.mark.parametrize("text, hosts", [
    ("node[01-03,07],gpu5", ["node01", "node02", "node03", "node07", "gpu5"]),
    ("gpu5", ["gpu5"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("r[1-2]c[3,5]-ib", ["r1c3-ib", "r1c5-ib", "r2c3-ib", "r2c5-ib"]),
    (" a , b[1-2] ", ["a", "b1", "b2"]),
])
def test_expand_hostlist(text: str, hosts: list[str]) -> None:
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text, message", [
    ("node[01-03", "unbalanced"), ("node01]", "unbalanced"), ("a,,b", "empty entry"),
    ("n[3-1]", "backwards"), ("n[a-b]", "not a number"), ("", "empty entry"),
])
def test_expand_hostlist_rejects(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        expand_hostlist(text)


def test_expand_tasks_per_node() -> None:
    assert cluster_env.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    assert cluster_env.expand_tasks_per_node("4") == [4]
    with pytest.raises(ValueError, match="N or N"):
        cluster_env.expand_tasks_per_node("2x3")


def test_slurm_rank_sizes_hosts_and_cluster_spec() -> None:
    env = detect(slurm_task(rank=3, local_rank=1, node=1))
    assert env == ClusterEnv("slurm", rank=3, size=6, local_rank=1, local_size=2,
                             hosts=("node01", "node02", "gpu5"), tasks_per_node=(2, 2, 2),
                             node_index=1, distribution="block", node="node02")
    spec = tf_config_from_slurm(slurm_task(rank=3, local_rank=1, node=1), port=2222)
    assert spec == {"cluster": {"worker": ["node01:2222", "node01:2223", "node02:2222",
                                           "node02:2223", "gpu5:2222", "gpu5:2223"]},
                    "task": {"type": "worker", "index": 3}}


def test_every_slurm_task_gets_the_same_cluster_and_its_own_index() -> None:
    layout = [(0, 0, 0), (1, 1, 0), (2, 0, 1), (3, 1, 1), (4, 0, 2), (5, 1, 2)]
    specs = [tf_config_from_slurm(slurm_task(r, lr, n), port=9000) for r, lr, n in layout]
    assert all(s["cluster"] == specs[0]["cluster"] for s in specs)
    assert [s["task"]["index"] for s in specs] == [0, 1, 2, 3, 4, 5]
    # Each task's own entry is its node and a port unique on that node.
    hosts = ["node01", "node02", "gpu5"]
    for (rank, local, node), s in zip(layout, specs, strict=True):
        assert s["cluster"]["worker"][rank] == f"{hosts[node]}:{9000 + local}"


def test_slurm_uneven_tasks_per_node_and_job_level_fallback() -> None:
    env = detect({"SLURM_PROCID": "4", "SLURM_NTASKS": "5", "SLURM_LOCALID": "0",
                  "SLURM_NODEID": "2", "SLURM_NODELIST": "c[1-3]",
                  "SLURM_TASKS_PER_NODE": "2(x2),1"})
    assert (env.rank, env.size, env.local_rank, env.local_size) == (4, 5, 0, 1)
    assert env.task_slots()[4] == ("c3", 0)


def test_slurm_ntasks_per_node_without_tasks_per_node() -> None:
    env = detect({"SLURM_PROCID": "5", "SLURM_NTASKS": "6", "SLURM_LOCALID": "2",
                  "SLURM_NODEID": "1", "SLURM_JOB_NODELIST": "g[1-2]",
                  "SLURM_NTASKS_PER_NODE": "3"})
    assert env.tasks_per_node == (3, 3) and env.local_size == 3


def test_slurm_cyclic_distribution() -> None:
    # 4 tasks on 2 nodes, round robin: ranks 0,2 on a; 1,3 on b.
    base = {"SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "a,b", "SLURM_TASKS_PER_NODE": "2(x2)",
            "SLURM_DISTRIBUTION": "cyclic:block"}
    spec = tf_config_from_slurm({**base, "SLURM_PROCID": "3", "SLURM_LOCALID": "1",
                                 "SLURM_NODEID": "1"}, port=100)
    assert spec["cluster"]["worker"] == ["a:100", "b:100", "a:101", "b:101"]
    with pytest.raises(ValueError, match="contradict"):
        # Rank 1 cannot be the second task on node a under a cyclic layout.
        tf_config_from_slurm({**base, "SLURM_PROCID": "1", "SLURM_LOCALID": "1",
                              "SLURM_NODEID": "0"})


def test_unsorted_nodelist_follows_slurm_order_where_tf_resolver_sorts(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from tensorflow.python.distribute.cluster_resolver.slurm_cluster_resolver import (
        SlurmClusterResolver,
    )

    step = {"SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
            "SLURM_STEP_NUM_TASKS": "4", "SLURM_STEP_NODELIST": "node[9-10]",
            "SLURM_STEP_TASKS_PER_NODE": "2(x2)"}
    for name, value in step.items():
        monkeypatch.setenv(name, value)
    # TF's resolver lists a task per GPU slot only, so it needs GPUs even to name workers.
    resolver = SlurmClusterResolver(port_base=7000, gpus_per_node=2, gpus_per_task=1,
                                    auto_set_gpu=False)
    theirs = resolver.cluster_spec().as_dict()["worker"]
    ours = tf_config_from_slurm(step, port=7000)["cluster"]["worker"]
    # Same workers, but TF puts node10 first (string sort), so its rank 0 is not on node9,
    # where Slurm started rank 0.
    assert sorted(theirs) == sorted(ours)
    assert ours[:2] == ["node9:7000", "node9:7001"]
    assert theirs[:2] == ["node10:7000", "node10:7001"]


@pytest.mark.parametrize("variables, message", [
    ({"SLURM_PROCID": "6"}, "rank 6 is not within a job of 6"),
    ({"SLURM_STEP_TASKS_PER_NODE": "2(x2)"}, "task counts for 2 nodes"),
    ({"SLURM_STEP_TASKS_PER_NODE": "3(x3)"}, "add up to 9"),
    ({"SLURM_NODEID": "7"}, "SLURM_NODEID=7"),
    ({"SLURM_LOCALID": "x"}, "not an integer"),
])
def test_inconsistent_slurm_variables_are_reported(variables: dict[str, str],
                                                   message: str) -> None:
    with pytest.raises(ValueError, match=message):
        detect({**slurm_task(rank=0, local_rank=0, node=0), **variables})


def test_openmpi_horovodrun_jsrun_pmi() -> None:
    ompi = detect({"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8",
                   "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "4"})
    assert (ompi.launcher, ompi.rank, ompi.size, ompi.local_rank, ompi.local_size) == (
        "openmpi", 5, 8, 1, 4)
    hvd = detect({"HOROVOD_RANK": "2", "HOROVOD_SIZE": "4", "HOROVOD_LOCAL_RANK": "0",
                  "HOROVOD_LOCAL_SIZE": "2", "HOROVOD_HOSTNAME": "gpu7"})
    assert (hvd.launcher, hvd.rank, hvd.local_size, hvd.node) == ("horovodrun", 2, 2, "gpu7")
    jsm = detect({"JSM_NAMESPACE_RANK": "7", "JSM_NAMESPACE_SIZE": "12",
                  "JSM_NAMESPACE_LOCAL_RANK": "1", "JSM_NAMESPACE_LOCAL_SIZE": "6",
                  "LSB_MCPU_HOSTS": "batch3 1 a01n01 42 a01n02 42",
                  # Spectrum MPI under jsrun sets Open MPI's variables too.
                  "OMPI_COMM_WORLD_RANK": "7", "OMPI_COMM_WORLD_SIZE": "12"})
    assert (jsm.launcher, jsm.rank, jsm.local_rank, jsm.hosts) == (
        "jsrun", 7, 1, ("a01n01", "a01n02"))
    hosts = cluster_env.detect({"JSM_NAMESPACE_RANK": "0", "JSM_NAMESPACE_SIZE": "2",
                                "LSB_HOSTS": "login1 h1 h1 h2 h2"}).hosts
    assert hosts == ("h1", "h2")
    pmi = detect({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1",
                  "MPI_LOCALNRANKS": "2"})
    assert (pmi.launcher, pmi.rank, pmi.size, pmi.local_rank, pmi.local_size) == (
        "pmi", 3, 4, 1, 2)


def test_inner_launcher_wins_over_the_batch_allocation() -> None:
    # mpirun inside sbatch: the batch step's SLURM_PROCID=0 is still in the environment.
    batch = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_JOB_NODELIST": "n[1-2]",
             "SLURM_TASKS_PER_NODE": "2(x2)", "SLURM_NODEID": "0"}
    inner = detect({**batch, "OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4"})
    assert (inner.launcher, inner.rank) == ("openmpi", 3)
    hydra = detect({**batch, "PMI_RANK": "2", "PMI_SIZE": "4"})
    assert (hydra.launcher, hydra.rank) == ("pmi", 2)
    # srun's own PMI agrees with Slurm's variables: Slurm's richer view is kept.
    srun_pmi = detect({**batch, "PMI_RANK": "0", "PMI_SIZE": "4"})
    assert srun_pmi.launcher == "slurm" and srun_pmi.hosts == ("n1", "n2")


def test_no_launcher_is_one_process() -> None:
    env = detect({})
    assert (env.launcher, env.rank, env.size, env.local_rank, env.local_size) == (
        "none", 0, 1, 0, 1)
    with pytest.raises(ValueError, match="not a Slurm task"):
        tf_config_from_slurm({})
    with pytest.raises(ValueError, match="rank layout is unknown"):
        cluster_env.tf_config(detect({"OMPI_COMM_WORLD_RANK": "0",
                                      "OMPI_COMM_WORLD_SIZE": "2"}))


def test_command_line_prints_tf_config() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM", "OMPI", "PMI",
                                                                      "HOROVOD", "JSM"))}
    env.update(slurm_task(rank=2, local_rank=0, node=1))
    out = subprocess.run([sys.executable, "-m", "tfscale.cli.tf_config", "--tf_config",
                          "--port", "4000"], cwd=ROOT, env=env, capture_output=True,
                         text=True, check=True).stdout
    spec = json.loads(out)
    assert spec["task"]["index"] == 2 and spec["cluster"]["worker"][2] == "node02:4000"
    env["SLURM_PROCID"] = "9"
    # The old name, as job scripts written before run it.
    bad = subprocess.run([sys.executable, "-m", "tfscale.cluster_env"], cwd=ROOT, env=env,
                         capture_output=True, text=True)
    assert bad.returncode == 2 and "rank 9" in bad.stderr


def test_this_process_takes_the_innermost_launcher() -> None:
    # A batch step's Slurm variables are inherited by workers that tfscale's local launcher
    # started inside it: the local launcher's variables are the truth for them.
    slurm = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0",
             "SLURM_NTASKS_PER_NODE": "4", "SLURM_JOB_NODELIST": "n1", "SLURMD_NODENAME": "n1"}
    local = {**slurm, "TFSCALE_LOCAL_RANK": "1", "TFSCALE_LOCAL_SIZE": "2"}
    env = cluster_env.this_process(local)
    assert (env.launcher, env.rank, env.size, env.local_rank, env.local_size) == (
        "tfscale", 1, 2, 1, 2)
    assert cluster_env.this_process(slurm).launcher == "slurm"
    # A simulated second node of a Horovod run: one worker here, rank 1 of 2 in the job.
    node = {"TFSCALE_LOCAL_RANK": "0", "TFSCALE_LOCAL_SIZE": "1", "HOROVOD_RANK": "1",
            "HOROVOD_SIZE": "2"}
    env = cluster_env.this_process(node)
    assert (env.rank, env.size, env.local_rank, env.local_size) == (1, 2, 0, 1)
    assert cluster_env.this_process({}).launcher == "none"


def test_this_process_reads_the_node_layout_from_tf_config() -> None:
    workers = ["a:1", "b:1", "a:2", "b:2", "a:3"]
    env = cluster_env.this_process({"TF_CONFIG": json.dumps(
        {"cluster": {"worker": workers}, "task": {"type": "worker", "index": 2}})})
    assert (env.launcher, env.rank, env.size, env.local_rank, env.local_size) == (
        "tf_config", 2, 5, 1, 3)
    with pytest.raises(ValueError, match="TF_CONFIG task index 7 is outside the 5 workers"):
        cluster_env.this_process({"TF_CONFIG": json.dumps(
            {"cluster": {"worker": workers}, "task": {"type": "worker", "index": 7}})})


def test_launched_means_started_by_something_else() -> None:
    assert not cluster_env.launched({})
    assert cluster_env.launched({"TFSCALE_LAUNCHED": "1"})
    assert cluster_env.launched({"TF_CONFIG": json.dumps(
        {"cluster": {"worker": ["a:1"]}, "task": {"type": "worker", "index": 0}})})
    one_rank = {"OMPI_COMM_WORLD_RANK": "0", "OMPI_COMM_WORLD_SIZE": "1"}
    assert not cluster_env.launched(one_rank)
    assert cluster_env.launched({**one_rank, "OMPI_COMM_WORLD_SIZE": "2"})


def test_restart_count_from_tfscale_then_slurm() -> None:
    assert cluster_env.restart_count({}) == 0
    assert cluster_env.restart_count({"SLURM_RESTART_COUNT": "2"}) == 2
    assert cluster_env.restart_count({"TFSCALE_RESTART": "1", "SLURM_RESTART_COUNT": "2"}) == 1
    with pytest.raises(ValueError, match="TFSCALE_RESTART='x' is not an integer"):
        cluster_env.restart_count({"TFSCALE_RESTART": "x"})
