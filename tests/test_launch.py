"""launch.jobscript: generated job scripts parse, say what was asked, refuse the impossible,
and their rank wrappers pin GPUs and build the cluster the way the launchers' variables say."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from launch.jobs import Knobs, ddlrun_request, render, request
from launch.jobs.spec import parse_hosts, parse_time
from launch.jobscript import main as jobscript
from tests.conftest import ROOT, TINY, read_results, requires_horovod, run_process

HVD = ("--model=resnet50", "--strategy=horovod")


def script(launcher: str, **fields: Any) -> str:
    fields.setdefault("train_args", HVD)
    fields.setdefault("workdir", str(ROOT))
    return render(request(launcher, **fields))


def bash_syntax_ok(text: str) -> None:
    proc = subprocess.run(["bash", "-n"], input=text, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def rank_script(text: str) -> str:
    """The per-rank wrapper embedded in a job script."""
    return text.split("<<'TFSCALE_RANK_SCRIPT'\n")[1].split("\nTFSCALE_RANK_SCRIPT\n")[0]


def test_slurm_24_horovod_ranks() -> None:
    text = script("slurm", nodes=4, gpus_per_node=6, cores_per_rank=7, time="2:00:00",
                  account="abc123", queue="gpu")
    bash_syntax_ok(text)
    for line in ("#SBATCH --nodes=4", "#SBATCH --ntasks-per-node=6", "#SBATCH --gpus-per-task=1",
                 "#SBATCH --cpus-per-task=7", "#SBATCH --time=02:00:00",
                 "#SBATCH --account=abc123", "#SBATCH --partition=gpu", "CORES_PER_RANK=7",
                 "    --cpu-bind=cores \\", '    --cpus-per-task="$CORES_PER_RANK" \\',
                 "    --mpi=pmix \\", '    "$LOG_DIR/rank.sh" || status=$?'):
        assert line in text.splitlines(), line
    assert "= 24 ranks" in text
    rank = rank_script(text)
    bash_syntax_ok(rank)
    assert "rank=${SLURM_PROCID:?" in rank and "local_rank=${SLURM_LOCALID:?" in rank
    assert "python3 -m tfscale.train --model=resnet50 --strategy=horovod &" in rank.splitlines()
    assert "#SBATCH --signal=USR1@180" in text and "#SBATCH --requeue" in text
    assert '  scontrol requeue "$SLURM_JOB_ID" && exit 0' in text.splitlines()
    assert "if not built('mpi'):" in text


def test_slurm_without_core_count_takes_whole_nodes_and_shares_their_cpus() -> None:
    text = script("slurm", nodes=2, gpus_per_node=4, time="90")
    assert "#SBATCH --exclusive" in text and "#SBATCH --time=01:30:00" in text
    assert "CORES_PER_RANK=$(( ${SLURM_CPUS_ON_NODE:-$(nproc)} / 4 ))" in text


def test_slurm_multiworker_builds_tf_config_and_skips_mpi() -> None:
    text = script("slurm", nodes=2, gpus_per_node=8, gpus_per_rank=8, port=23456,
                  train_args=("--strategy=multiworker",))
    bash_syntax_ok(text)
    assert "--mpi=" not in text and "import built" not in text
    assert "#SBATCH --ntasks-per-node=1" in text and "#SBATCH --gpus-per-task=8" in text
    assert "-m tfscale.cli.tf_config --tf_config --port 23456)" in rank_script(text)


def test_lsf_jsrun_summit_resource_sets() -> None:
    text = script("lsf", nodes=4, gpus_per_node=6, time="1-00:30:00", account="ABC123",
                  stage_dir="/mnt/bb/$USER")
    bash_syntax_ok(text)
    for line in ("#BSUB -nnodes 4", "#BSUB -W 24:30", "#BSUB -P ABC123",
                 '#BSUB -alloc_flags "smt4 nvme"', "    --nrs 24 \\", "    --rs_per_host 6 \\",
                 "    --tasks_per_rs 1 \\", "    --cpu_per_rs 7 \\", "    --gpu_per_rs 1 \\",
                 "    --bind packed:7 \\", "    --launch_distribution packed \\"):
        assert line in text.splitlines(), line
    rank = rank_script(text)
    assert "rank=${JSM_NAMESPACE_RANK:?" in rank
    assert 'stage_dir="/mnt/bb/$USER"' in rank and '--stage_dir="$stage_dir"' in rank


def test_mpirun_binding_hosts_and_environment() -> None:
    hosts = ",".join(f"gpu{i}:6" for i in range(4))
    text = script("mpirun", hosts=parse_hosts(hosts), gpus_per_node=6, cores_per_rank=7,
                  iface="ib0")
    bash_syntax_ok(text)
    for line in ("    -np 24 \\", f"    -H {hosts} \\",
                 '    "${binding[@]}" \\',
                 '  binding=(--map-by "ppr:6:node:PE=$CORES_PER_RANK" --bind-to core)',
                 '    "${forward[@]}" \\',
                 "    --mca btl_tcp_if_include ib0 --mca oob_tcp_if_include ib0 \\"):
        assert line in text.splitlines(), line
    assert 'forward+=(-x "$v")' in text and "OMPI_ALLOW_RUN_AS_ROOT=1" in text
    assert "rank=${OMPI_COMM_WORLD_RANK:?" in rank_script(text)


def test_horovodrun_gloo_and_mpi() -> None:
    gloo = script("horovodrun", hosts=parse_hosts("a:2,b:2"), gpus_per_node=2)
    bash_syntax_ok(gloo)
    assert "    -np 4 \\" in gloo and "    -H a:2,b:2 \\" in gloo and "    --gloo \\" in gloo
    assert "rank=${HOROVOD_RANK:?" in rank_script(gloo) and "taskset -c" in rank_script(gloo)
    assert "if not built('gloo'):" in gloo
    mpi = script("horovodrun", hosts=parse_hosts("a:2,b:2"), gpus_per_node=2, mpi=True)
    bash_syntax_ok(mpi)
    assert '--binding-args="${binding[*]}"' in mpi
    assert '  binding=(--map-by ppr:2:node --bind-to none --oversubscribe)' in mpi.splitlines()
    assert "rank=${OMPI_COMM_WORLD_RANK:?" in rank_script(mpi) and "if not built('mpi'):" in mpi


def test_ddlrun_front_end_maps_to_mpirun_with_ddl() -> None:
    req = ddlrun_request("host1,host2", accelerators=4, train_args=("--model=resnet50",),
                         workdir=str(ROOT))
    assert (req.launcher, req.total_ranks, req.strategy) == ("mpirun", 8, "ddl")
    text = render(req)
    assert "    -H host1:4,host2:4 \\" in text and "--strategy=ddl" in rank_script(text)
    with pytest.raises(ValueError, match="DDL-style"):
        ddlrun_request("a,b", 4, train_args=("--strategy=multiworker",))


def test_knobs_are_exported_to_every_rank() -> None:
    knobs = Knobs(fusion_threshold_mb=64, cycle_time_ms=2.5, hierarchical_allreduce=True,
                  nccl_debug="INFO", tf_log_level=1)
    rank = rank_script(script("slurm", nodes=2, gpus_per_node=4, knobs=knobs))
    for line in ('export HOROVOD_FUSION_THRESHOLD="${HOROVOD_FUSION_THRESHOLD:-67108864}"',
                 'export HOROVOD_CYCLE_TIME="${HOROVOD_CYCLE_TIME:-2.5}"',
                 'export HOROVOD_HIERARCHICAL_ALLREDUCE="${HOROVOD_HIERARCHICAL_ALLREDUCE:-1}"',
                 'export NCCL_DEBUG="${NCCL_DEBUG:-INFO}"',
                 'export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-1}"'):
        assert line in rank.splitlines(), line
    assert "HOROVOD_FUSION_THRESHOLD" not in rank_script(script("slurm", gpus_per_node=1))


@pytest.mark.parametrize("launcher, fields, message", [
    ("slurm", {"nodes": 0}, "--nodes=0: a job needs at least one node"),
    ("slurm", {"gpus_per_node": 8, "node_gpus": 4}, "more GPUs than the 4 a node has"),
    ("lsf", {"gpus_per_node": 8}, "more GPUs than the 6 a node has"),
    ("lsf", {"gpus_per_node": 6, "node_gpus": 8}, "at most 6 GPUs per node"),
    ("lsf", {"gpus_per_node": 6, "cores_per_rank": 8}, "more than the 42 cores"),
    ("lsf", {"gpus_per_node": 6, "cores_per_node": 48, "cores_per_rank": 8}, "exceeds the 42"),
    ("slurm", {"gpus_per_node": 4, "gpus_per_rank": 2}, "one rank per GPU"),
    ("slurm", {"gpus_per_node": 6, "gpus_per_rank": 4, "train_args": ("--strategy=multiworker",)},
     "not a multiple"),
    ("slurm", {"nodes": 2, "train_args": ("--strategy=default",)}, "runs in one process"),
    ("slurm", {"nodes": 4, "gpus_per_node": 6, "train_args": HVD + ("--num_processes=2",)},
     "the job starts 24 ranks"),
    ("slurm", {"train_args": ("--strategy=horovod", "--batch_siz=3")}, "tfscale.train flags"),
    ("slurm", {"train_args": ("--strategy=horovod", "--precision=fp8")}, "--precision='fp8'"),
    ("slurm", {"train_args": ("--strategy=horovod", "--model=resnt50")},
     "unknown model 'resnt50'; available: deeplabv3plus, "),
    ("slurm", {"train_args": ("--strategy=horovod", "--dataset=imagenett")},
     "unknown dataset 'imagenett'; available: image_folder, "),
    ("slurm", {"train_args": ("--strategy=horovod", "--model=deeplabv3plus")},
     "--model=deeplabv3plus is a segmentation model but --dataset=synthetic"),
    ("slurm", {"time": "01:30"}, "HH:MM:SS"),
    ("slurm", {"hosts": (("a", 0),)}, "give --nodes, not -H"),
    ("slurm", {"cores_per_node": 16, "ranks_per_node": 4, "cores_per_rank": 5},
     "more than the 16 cores"),
    ("slurm", {"stage_dir": '/tmp/"x'}, "quotes"),
    ("mpirun", {"nodes": 2}, "needs the hosts"),
    ("mpirun", {"hosts": (("a", 4), ("b", 4)), "gpus_per_node": 6}, "host a has 4 slot(s)"),
    ("horovodrun", {"train_args": ("--strategy=multiworker",), "ranks_per_node": 2},
     "horovodrun cannot start --strategy=multiworker jobs; it starts ddl, horovod jobs, and "
     "multiworker runs under lsf, mpirun, slurm"),
])
def test_impossible_requests_are_refused(launcher: str, fields: dict[str, Any],
                                         message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        script(launcher, **fields)


def test_parse_helpers() -> None:
    assert parse_hosts("node[01-02],gpu5") == (("node01", 0), ("node02", 0), ("gpu5", 0))
    assert parse_hosts("a:2,b:3") == (("a", 2), ("b", 3))
    for bad in ("a:0", "a:x", "a:2,a:2", "a;b"):
        with pytest.raises(ValueError):
            parse_hosts(bad)
    assert parse_time("1-02:03:04") == 93784 and parse_time("5") == 300
    with pytest.raises(ValueError, match="positive"):
        parse_time("00:00:00")


def test_command_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "job.sbatch"
    code = jobscript(["slurm", "--nodes", "2", "--gpus_per_node", "4", "-o", str(out),
                      "--setup", "module load cuda", "--", *HVD])
    assert code == 0 and os.access(out, os.X_OK)
    text = out.read_text()
    assert "module load cuda" in text.splitlines()
    assert "# Written by: python -m launch.jobscript slurm --nodes 2" in text
    assert f"{sys.executable} -m tfscale.train" in text
    hostfile = tmp_path / "hosts"
    hostfile.write_text("# two nodes\nh1 slots=4\nh2 slots=4\n")
    assert jobscript(["mpirun", "--hostfile", str(hostfile), "--gpus_per_node", "4", "--",
                      *HVD]) == 0
    assert "    -H h1:4,h2:4 \\" in capsys.readouterr().out
    assert jobscript(["lsf", "--gpus_per_node", "7", "--", *HVD]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: ") and "6 a node has" in err and "\n" not in err
    assert jobscript(["ddlrun", "--accelerators", "2", "--", *HVD]) == 2
    assert "needs the hosts" in capsys.readouterr().err
    assert jobscript(["slurm", "-o", str(tmp_path / "typo.sbatch"), "--", *HVD,
                      "--model=resnt50"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: unknown model 'resnt50'") and "\n" not in err, err
    assert not (tmp_path / "typo.sbatch").exists()


STUB = """#!{python}
# Stands in for Python in the rank wrapper: runs tfscale.cli.tf_config for real, and instead of
# training prints what tfscale.train would have been given.
import json, os, sys
if sys.argv[1:3] == ["-m", "tfscale.cli.tf_config"]:
    os.execv({python!r}, [{python!r}, *sys.argv[1:]])
keep = ("CUDA_VISIBLE_DEVICES", "TF_CONFIG", "HOROVOD_FUSION_THRESHOLD")
print("STUB " + json.dumps({{"argv": sys.argv[1:], **{{k: os.environ.get(k) for k in keep}}}}))
"""


def run_rank(tmp_path: Path, text: str, env: dict[str, str]) -> dict[str, Any]:
    """Runs a job script's rank wrapper with launcher variables ``env``; returns the stub's
    report of what tfscale.train would get."""
    wrapper = tmp_path / "logs" / "rank.sh"
    wrapper.parent.mkdir(exist_ok=True)
    wrapper.write_text(rank_script(text) + "\n")
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith(("SLURM", "OMPI", "JSM", "HOROVOD", "PMI", "CUDA", "TF_CONFIG"))}
    proc = subprocess.run(["bash", str(wrapper)], env={**clean, **env}, capture_output=True,
                          text=True, timeout=60)
    log = (wrapper.parent / f"rank-{env.get('SLURM_PROCID', env.get('JSM_NAMESPACE_RANK'))}"
           ".log").read_text()
    if proc.returncode:
        return {"error": log}
    return json.loads(log.split("STUB ", 1)[1])


@pytest.fixture
def stub(tmp_path: Path) -> str:
    path = tmp_path / "python"
    path.write_text(STUB.format(python=sys.executable))
    path.chmod(0o755)
    return str(path)


def slurm_vars(rank: int, local: int, node: int) -> dict[str, str]:
    return {"SLURM_PROCID": str(rank), "SLURM_LOCALID": str(local), "SLURM_NODEID": str(node),
            "SLURM_STEP_NUM_TASKS": "8", "SLURM_STEP_NODELIST": "gpu[07-08]",
            "SLURM_STEP_TASKS_PER_NODE": "4(x2)", "SLURMD_NODENAME": f"gpu0{7 + node}"}


def test_rank_wrapper_pins_gpus_by_local_rank(tmp_path: Path, stub: str) -> None:
    text = script("slurm", nodes=2, gpus_per_node=4, python=stub)
    assert run_rank(tmp_path, text, slurm_vars(6, 2, 1))["CUDA_VISIBLE_DEVICES"] == "2"
    # srun --gpus-per-task already gave the task exactly its GPU: kept as it is.
    bound = {**slurm_vars(6, 2, 1), "CUDA_VISIBLE_DEVICES": "0"}
    assert run_rank(tmp_path, text, bound)["CUDA_VISIBLE_DEVICES"] == "0"
    # Two GPUs per rank out of a visible set: local rank 1 takes the second pair.
    multi = script("slurm", gpus_per_node=4, gpus_per_rank=2, python=stub,
                   train_args=("--strategy=multiworker",))
    pair = {**slurm_vars(1, 1, 0), "SLURM_STEP_NUM_TASKS": "2", "SLURM_STEP_NODELIST": "gpu07",
            "SLURM_STEP_TASKS_PER_NODE": "2", "CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    assert run_rank(tmp_path, multi, pair)["CUDA_VISIBLE_DEVICES"] == "6,7"
    too_far = {**slurm_vars(6, 5, 1)}
    assert "needs 1 GPU(s) from index 5" in run_rank(tmp_path, text, too_far)["error"]


# A rank that exits with EXIT_PEER_LOST (4) just as the launcher stops the step: once its wrapper
# has set its traps (SigCgt has SIGTERM's bit), it sends the wrapper a TERM and exits.
LEAVING = """#!/usr/bin/env bash
until (( 16#$(awk '/^SigCgt:/ {print $2}' /proc/$PPID/status) >> 14 & 1 )); do sleep 0.01; done
kill -s TERM "$PPID"
exit 4
"""


def test_slurm_rank_wrapper_reports_the_exit_code_of_a_rank_stopped_with_the_step(
        tmp_path: Path) -> None:
    """The TERM that reaches the wrapper as its rank exits does not replace the rank's exit code,
    which the job's exit code must carry. When the wrapper waited with its traps set, 143 came
    back in about half of these stops (and in a CI run's cut-link job)."""
    leaving = tmp_path / "leaving"
    leaving.write_text(LEAVING)
    leaving.chmod(0o755)
    wrapper = tmp_path / "rank.sh"
    wrapper.write_text(rank_script(script("slurm", python=str(leaving))) + "\n")
    env = {**os.environ, **slurm_vars(0, 0, 0)}
    codes = [subprocess.run(["bash", str(wrapper)], env=env, timeout=60).returncode
             for _ in range(8)]
    assert codes == [4] * 8, codes


def test_simulated_slurm_step_gives_each_rank_its_cluster_spec(tmp_path: Path, stub: str) -> None:
    text = script("slurm", nodes=2, gpus_per_node=4, python=stub, port=30000,
                  train_args=("--strategy=multiworker", "--model=tiny_cnn"))
    workers = [f"gpu0{7 + n}:{30000 + i}" for n in range(2) for i in range(4)]
    for rank in range(8):
        got = run_rank(tmp_path, text, slurm_vars(rank, rank % 4, rank // 4))
        assert json.loads(got["TF_CONFIG"]) == {"cluster": {"worker": workers},
                                                "task": {"type": "worker", "index": rank}}
        assert got["CUDA_VISIBLE_DEVICES"] == str(rank % 4)
        assert got["argv"] == ["-m", "tfscale.train", "--strategy=multiworker",
                               "--model=tiny_cnn"]


def test_jsrun_rank_keeps_its_resource_set_gpu(tmp_path: Path, stub: str) -> None:
    text = script("lsf", nodes=2, gpus_per_node=6, python=stub,
                  knobs=Knobs(fusion_threshold_mb=1))
    env = {"JSM_NAMESPACE_RANK": "9", "JSM_NAMESPACE_LOCAL_RANK": "3", "CUDA_VISIBLE_DEVICES": "0"}
    got = run_rank(tmp_path, text, env)
    assert got["CUDA_VISIBLE_DEVICES"] == "0" and got["HOROVOD_FUSION_THRESHOLD"] == "1048576"


FAKE_SRUN = """#!/usr/bin/env bash
# A one-node srun: starts --ntasks-per-node copies of the program with Slurm's task variables.
set -u
for arg in "$@"; do case $arg in --ntasks-per-node=*) n=${arg#*=};; esac; done
program=${!#}
export SLURM_STEP_NUM_TASKS=$n SLURM_STEP_NODELIST=localhost SLURM_STEP_TASKS_PER_NODE=$n
pids=()
for ((i = 0; i < n; i++)); do
  SLURM_PROCID=$i SLURM_LOCALID=$i SLURM_NODEID=0 SLURMD_NODENAME=localhost "$program" &
  pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""


@pytest.mark.slow
def test_slurm_multiworker_job_trains_two_workers(tmp_path: Path) -> None:
    """The generated sbatch script, run by a one-node stand-in for srun: two real
    MultiWorkerMirroredStrategy workers find each other through TF_CONFIG from Slurm's
    variables."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    job = tmp_path / "job.sbatch"
    model_dir = tmp_path / "model"
    assert jobscript(["slurm", "--ranks_per_node", "2", "--cores_per_rank", "1",
                      "--port", str(20000 + os.getpid() % 20000), "--log_dir", str(tmp_path),
                      "-o", str(job), "--", "--strategy=multiworker", *TINY, "--steps=3",
                      f"--model_dir={model_dir}"]) == 0
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "SLURM_JOB_ID": "77"}
    proc = run_process(["bash", str(job)], timeout=300, env=env)
    logs = sorted((tmp_path / "tfscale-77").glob("rank-*.log"))
    assert proc.returncode == 0, proc.stderr + "".join(p.read_text()[-2000:] for p in logs)
    assert [p.name for p in logs] == ["rank-0.log", "rank-1.log"]
    results = read_results(model_dir)
    assert results["strategy"] == "multiworker" and results["num_workers"] == 2


@pytest.mark.slow
@requires_horovod
def test_horovodrun_gloo_job_trains_two_ranks(tmp_path: Path) -> None:
    job, model_dir = tmp_path / "job.sh", tmp_path / "model"
    assert jobscript(["horovodrun", "-H", "localhost:2", "--log_dir", str(tmp_path),
                      "-o", str(job), "--fusion_threshold_mb", "8", "--", "--strategy=horovod",
                      *TINY, "--steps=3", f"--model_dir={model_dir}"]) == 0
    proc = run_process(["bash", str(job)], timeout=300, env={"SLURM_JOB_ID": "hvd"})
    logs = sorted((tmp_path / "tfscale-hvd").glob("rank-*.log"))
    assert proc.returncode == 0, proc.stderr + "".join(p.read_text()[-2000:] for p in logs)
    assert [p.name for p in logs] == ["rank-0.log", "rank-1.log"]
    assert "[tfscale] rank 1 (local 1)" in logs[1].read_text()
    results = read_results(model_dir)
    assert results["strategy"] == "horovod" and results["num_workers"] == 2
