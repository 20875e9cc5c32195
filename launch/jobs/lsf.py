"""LSF with ``jsrun`` on a Summit-style machine: a ``bsub`` script, one resource set per GPU.

A Summit node has 6 GPUs and 42 usable cores (2 sockets x 21): by default each rank is a
resource set of 1 task, 1 GPU and 7 cores, 6 per node, bound with ``--bind packed:7``.
``--stage_dir`` adds the ``nvme`` allocation flag, which mounts the node-local burst buffer.
"""

from __future__ import annotations

from launch.jobs import script
from launch.jobs.registry import register
from launch.jobs.spec import JobRequest
from tfscale.strategies import Rendezvous

SUMMIT_GPUS = 6
SUMMIT_CORES = 42


@register("lsf", "bsub script, jsrun resource sets (Summit-style: 6 GPUs, 42 cores a node)",
          node_gpus=SUMMIT_GPUS, cores_per_node=SUMMIT_CORES)
def render(req: JobRequest) -> str:
    """The bsub script for ``req``.

    Raises:
        ValueError: for hosts (LSF chooses them), or more than 6 GPUs / 42 cores a node.
    """
    if req.hosts:
        raise ValueError("LSF chooses the nodes: give --nodes, not -H")
    if req.gpus_per_node > SUMMIT_GPUS or req.node_gpus > SUMMIT_GPUS:
        raise ValueError(f"jsrun on a Summit-style node: at most {SUMMIT_GPUS} GPUs per node "
                         f"(one resource set per GPU); got --gpus_per_node="
                         f"{req.gpus_per_node}, --node_gpus={req.node_gpus}")
    if req.cores_per_rank * req.ranks_per_node > SUMMIT_CORES:
        raise ValueError(f"{req.ranks_per_node} ranks x {req.cores_per_rank} cores exceeds the "
                         f"{SUMMIT_CORES} usable cores of a Summit-style node")
    hours, minutes = divmod(-(-req.time_seconds // 60), 60)
    flags = "smt4 nvme" if req.stage_dir else "smt4"
    header = [f"#BSUB -J {req.job_name}", f"#BSUB -nnodes {req.nodes}",
              f"#BSUB -W {hours}:{minutes:02d}"]
    if req.account:
        header.append(f"#BSUB -P {req.account}")
    if req.queue:
        header.append(f"#BSUB -q {req.queue}")
    header += [f"#BSUB -o {req.workdir}/{req.job_name}-%J.out", f'#BSUB -alloc_flags "{flags}"']
    tf_args = ["--ranks_per_node", str(req.ranks_per_node)]
    rank = script.rank_script(req, "JSM_NAMESPACE_RANK", "JSM_NAMESPACE_LOCAL_RANK", "jsrun",
                              tf_config_args=tf_args)
    cores = req.cores_per_rank
    launch = ["jsrun", f"--nrs {req.total_ranks}", f"--rs_per_host {req.ranks_per_node}",
              "--tasks_per_rs 1", f"--cpu_per_rs {cores}",
              f"--gpu_per_rs {req.gpus_per_rank if req.gpus_per_node else 0}",
              f"--bind packed:{cores}", "--launch_distribution packed"]
    if req.strategy_class.rendezvous == Rendezvous.TF_CONFIG:
        launch.append('--smpiargs="off"')  # TF's own collectives: no MPI in the ranks
    launch.append('"$LOG_DIR/rank.sh"')
    return script.job_script(req, header, rank, launch, script.preflight(req, "mpi"))
