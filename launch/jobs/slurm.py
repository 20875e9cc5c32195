"""Slurm: an ``sbatch`` script that starts one rank per task with ``srun``.

Tasks per node = GPUs per node / GPUs per rank, each task bound to its cores
(``--cpu-bind=cores``). Horovod ranks (the horovod and ddl strategies) need a Horovod built with
MPI, which srun wires up through its PMI plugin (``--mpi=pmix`` by default); TF_CONFIG ranks
(multiworker) build their TF_CONFIG from Slurm's variables (:mod:`tfscale.cli.tf_config`).
"""

from __future__ import annotations

from launch.jobs import script
from launch.jobs.registry import register
from launch.jobs.spec import JobRequest
from tfscale.config.errors import EXIT_PREEMPTED
from tfscale.strategies import Rendezvous

# Seconds before the time limit at which Slurm sends the ranks SIGUSR1 (its resolution is
# about a minute); tfscale.train then checkpoints and exits with EXIT_PREEMPTED.
WARNING_SECONDS = 180


def slurm_time(seconds: int) -> str:
    """Slurm's ``[D-]HH:MM:SS``."""
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


@register("slurm", "sbatch script, srun with one task per GPU and CPU binding")
def render(req: JobRequest) -> str:
    """The sbatch script for ``req``.

    Raises:
        ValueError: when hosts are given (Slurm chooses the nodes).
    """
    if req.hosts:
        raise ValueError("slurm chooses the nodes: give --nodes, not -H")
    header = [f"#SBATCH --job-name={req.job_name}", f"#SBATCH --nodes={req.nodes}",
              f"#SBATCH --ntasks-per-node={req.ranks_per_node}"]
    gpus = [f"--gpus-per-task={req.gpus_per_rank}"] if req.gpus_per_node else []
    header += [f"#SBATCH {g}" for g in gpus]
    if req.cores_per_rank:
        header.append(f"#SBATCH --cpus-per-task={req.cores_per_rank}")
    else:
        # Whole nodes, so that SLURM_CPUS_ON_NODE is every core, shared among the ranks.
        header.append("#SBATCH --exclusive")
    header.append(f"#SBATCH --time={slurm_time(req.time_seconds)}")
    # The time-limit warning goes to every rank; a job stopped by it is requeued (below).
    warning = min(WARNING_SECONDS, req.time_seconds // 4)
    header += [f"#SBATCH --signal=USR1@{warning}", "#SBATCH --requeue"]
    if req.account:
        header.append(f"#SBATCH --account={req.account}")
    if req.queue:
        header.append(f"#SBATCH --partition={req.queue}")
    header.append(f"#SBATCH --output={req.workdir}/{req.job_name}-%j.out")
    rank = script.rank_script(req, "SLURM_PROCID", "SLURM_LOCALID", "srun",
                              preempted_marker=True)
    # srun no longer inherits --cpus-per-task from sbatch (Slurm 22.05+): give it again.
    launch = ["srun", f"--nodes={req.nodes}", f"--ntasks-per-node={req.ranks_per_node}",
              '--cpus-per-task="$CORES_PER_RANK"', "--cpu-bind=cores", *gpus,
              "--kill-on-bad-exit=1", "--export=ALL"]
    if req.strategy_class.rendezvous == Rendezvous.HOROVOD:
        launch.append(f"--mpi={req.srun_mpi}")
    launch.append('"$LOG_DIR/rank.sh"')
    extra = [*script.cores_per_rank(req, "${SLURM_CPUS_ON_NODE:-$(nproc)}"),
             *script.preflight(req, "mpi")]
    after = [f'if [ "$status" -eq 0 ] && [ -e "$LOG_DIR/{script.PREEMPTED_MARKER}" ]; then',
             '  echo "[tfscale] the ranks stopped at a warning signal (time limit or '
             'preemption) with a checkpoint; requeueing job $SLURM_JOB_ID, which resumes from '
             'it (restart $(( ${SLURM_RESTART_COUNT:-0} + 1 )))"',
             '  scontrol requeue "$SLURM_JOB_ID" && exit 0',
             f"  status={EXIT_PREEMPTED}",
             "fi"]
    return script.job_script(req, header, rank, launch, extra, after)
