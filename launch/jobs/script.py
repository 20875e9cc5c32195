"""The parts every job script shares: the per-rank wrapper, the log directory, the pre-flight
check and the launch line with its failure report.

A job script writes ``rank.sh`` into its log directory and starts one copy per rank with the
cluster's launcher. ``rank.sh`` reads the rank and local rank from the launcher's variables,
sets the communication knobs, pins the rank to its GPU(s) by local rank, and runs
``python -m tfscale.train`` with its output in ``rank-<rank>.log`` next to it.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Sequence

from launch.jobs.spec import JobRequest
from tfscale.config.errors import EXIT_PREEMPTED
from tfscale.strategies import Rendezvous

RANK_SCRIPT_END = "TFSCALE_RANK_SCRIPT"
PREEMPTED_MARKER = "preempted"
# A requeued Slurm job keeps its id: its attempts get log directories of their own.
JOB_ID = ("${SLURM_JOB_ID:-${LSB_JOBID:-$(date +%Y%m%d-%H%M%S)-$$}}"
          "${SLURM_RESTART_COUNT:+-restart$SLURM_RESTART_COUNT}")


def quote(words: Sequence[str]) -> str:
    """Shell-quoted words joined by spaces."""
    return " ".join(shlex.quote(w) for w in words)


def command(parts: Sequence[str]) -> str:
    """A long command over several lines, one part (an option with its value) per line.

    Parts are written as given, so callers quote what needs it.
    """
    return " \\\n    ".join(parts)


def cores_per_rank(req: JobRequest, cpus_on_node: str, name: str = "CORES_PER_RANK",
                   share: bool = False) -> list[str]:
    """Lines setting shell variable ``name`` to the cores per rank: the request's number, or
    the node's CPUs (``cpus_on_node``, a shell expression) shared among its ranks at run time.

    Args:
        share: when a node has fewer CPUs than ranks, set 0 (the ranks share the CPUs,
            unbound) and say so, instead of stopping the job. For launchers that can run more
            ranks than cores (mpirun, horovodrun); Slurm would not allocate them.
    """
    if req.cores_per_rank:
        return [f"{name}={req.cores_per_rank}"]
    lines = [f"{name}=$(( {cpus_on_node} / {req.ranks_per_node} ))"]
    if share:
        return lines + [f'[ "${name}" -ge 1 ] || echo "[tfscale] warning: {req.ranks_per_node} '
                        f'ranks per node share {cpus_on_node} CPU(s): they are not bound to '
                        'cores" >&2']
    return lines + [f'[ "${name}" -ge 1 ] || {{ echo "error: {req.ranks_per_node} ranks per node '
                    f'but only {cpus_on_node} CPUs" >&2; exit 1; }}']


def mpi_binding(req: JobRequest, name: str = "binding") -> list[str]:
    """Lines setting shell array ``name`` to Open MPI's mapping and binding options: each
    rank on its ``$CORES_PER_RANK`` cores, or, where the ranks share fewer cores
    (:func:`cores_per_rank` with ``share``), mapped but not bound."""
    ppr = f"ppr:{req.ranks_per_node}:node"
    return ['if [ "$CORES_PER_RANK" -ge 1 ]; then',
            f'  {name}=(--map-by "{ppr}:PE=$CORES_PER_RANK" --bind-to core)',
            "else",
            f"  {name}=(--map-by {ppr} --bind-to none --oversubscribe)",
            "fi"]


def rank_script(req: JobRequest, rank_var: str, local_rank_var: str, launcher: str,
                tf_config_args: Sequence[str] = (), taskset: bool = False,
                preempted_marker: bool = False) -> str:
    """The per-rank wrapper.

    Args:
        req: the request.
        rank_var: the launcher's variable holding the global rank.
        local_rank_var: the launcher's variable holding the rank on its node.
        launcher: the launcher's name, for the error when the variables are missing.
        tf_config_args: extra ``tfscale.cli.tf_config`` options to build TF_CONFIG with (for
            strategies whose ranks find each other through a TF_CONFIG).
        taskset: bind the rank to its share of the cores here (for launchers that do not).
        preempted_marker: a rank stopped by a warning signal (exit code EXIT_PREEMPTED,
            checkpoint written) leaves ``PREEMPTED_MARKER`` in the log directory and exits 0,
            so a launcher that kills the whole step on a failed rank (``srun
            --kill-on-bad-exit``) does not kill ranks that are still writing their exit; the
            job script then requeues the job.
    """
    lines = [
        "#!/usr/bin/env bash",
        f"# One rank of the job, started by {launcher} once per rank.",
        "set -euo pipefail",
        f'rank=${{{rank_var}:?not started by {launcher}}}',
        f'local_rank=${{{local_rank_var}:?not started by {launcher}}}',
        'exec >"$(dirname "$0")/rank-$rank.log" 2>&1',
        f"cd {shlex.quote(req.workdir)}",
        "# Communication knobs (a value already in the environment wins).",
    ]
    for name, value in req.environment.items():
        lines.append(f'export {name}="${{{name}:-{value}}}"')
    if req.gpus_per_node:
        lines += _gpu_pinning(req)
    args = [req.python, "-m", "tfscale.train", *req.train_args]
    if req.stage_dir:
        lines += ["# Node-local copy of this rank's data (tfscale.train --stage_dir fills it).",
                  f'stage_dir="{req.stage_dir}"', 'mkdir -p "$stage_dir"']
    if req.strategy_class.rendezvous == Rendezvous.TF_CONFIG:
        resolve = [req.python, "-m", "tfscale.cli.tf_config", "--tf_config",
                   "--port", str(req.port), *tf_config_args]
        lines += ["# This rank's place in the TF cluster, from the launcher's variables.",
                  f"TF_CONFIG=$({quote(resolve)})", "export TF_CONFIG"]
    run = quote(args) + (' --stage_dir="$stage_dir"' if req.stage_dir else "")
    if taskset:
        lines += [*cores_per_rank(req, "$(nproc)", "cores", share=True),
                  "first=$((local_rank * cores))",
                  'run=(taskset -c "$first-$((first + cores - 1))")',
                  '{ command -v taskset >/dev/null && [ "$cores" -ge 1 ]; } || run=()']
        run = '"${run[@]}" ' + run
    lines.append('echo "[tfscale] rank $rank (local $local_rank) on $(hostname)'
                 ' CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-}"')
    if not preempted_marker:
        return "\n".join([*lines, f"exec {run}"]) + "\n"
    lines += [
        "# The launcher's warning signals go to the training process; its exit code decides.",
        f"{run} &", "pid=$!",
        "trap 'kill -s USR1 \"$pid\" 2>/dev/null || true' USR1",
        "trap 'kill -s TERM \"$pid\" 2>/dev/null || true' TERM",
        # No wait while the traps are set: a trapped signal cuts a wait short with 128 + its
        # number, and where the process ends at that moment bash loses its status (143 or -1
        # came back for a rank that exited 4 as the step was stopped). A sleep defers the
        # trap by at most half a second; the last wait, with nothing left to forward, is
        # never cut short.
        'while kill -0 "$pid" 2>/dev/null; do',
        "  sleep 0.5 || true",
        "done",
        "trap '' TERM USR1",
        'wait "$pid" && status=0 || status=$?',
        f'if [ "$status" -eq {EXIT_PREEMPTED} ]; then',
        f'  echo "rank $rank" >> "$(dirname "$0")/{PREEMPTED_MARKER}"',
        "  exit 0",
        "fi",
        'exit "$status"']
    return "\n".join(lines) + "\n"


def _gpu_pinning(req: JobRequest) -> list[str]:
    node_gpus = req.node_gpus or req.gpus_per_node
    return [
        "# Pin this rank to its GPU(s) by local rank, unless the launcher already gave it",
        "# exactly its own (srun --gpus-per-task, jsrun --gpu_per_rs).",
        f"gpus_per_rank={req.gpus_per_rank}",
        'if [ -n "${CUDA_VISIBLE_DEVICES:-}" ]; then',
        '  IFS=, read -ra visible <<<"$CUDA_VISIBLE_DEVICES"',
        "else",
        f"  visible=($(seq 0 {node_gpus - 1}))",
        "fi",
        'if [ "${#visible[@]}" -ne "$gpus_per_rank" ]; then',
        "  first=$((local_rank * gpus_per_rank))",
        '  if [ $((first + gpus_per_rank)) -gt "${#visible[@]}" ]; then',
        '    echo "error: local rank $local_rank needs $gpus_per_rank GPU(s) from index $first,'
        ' but this node shows: ${visible[*]}" >&2',
        "    exit 1",
        "  fi",
        '  CUDA_VISIBLE_DEVICES=$(IFS=,; echo "${visible[*]:first:gpus_per_rank}")',
        "  export CUDA_VISIBLE_DEVICES",
        "fi",
    ]


def preflight(req: JobRequest, needs: str) -> list[str]:
    """Lines that stop the job early when Horovod cannot work here.

    Args:
        req: the request (its strategy's ranks may need Horovod to find each other).
        needs: ``"mpi"`` or ``"gloo"``: which Horovod controller the launcher relies on.
    """
    if req.strategy_class.rendezvous != Rendezvous.HOROVOD:
        return []
    hint = ("TFSCALE_WITH_MPI=1 bash launch/setup.sh" if needs == "mpi"
            else "bash launch/setup.sh")
    # tfscale's check loads Horovod's ops library without importing TensorFlow: 0.7 s of
    # CPU, where importing horovod.tensorflow takes 4 s (5.5-6.4 s on an AVX2-only EPYC).
    return [f"# The {req.strategy} strategy needs a Horovod built with {needs.upper()}.",
            f"TF_CPP_MIN_LOG_LEVEL=3 {shlex.quote(req.python)} - <<'TFSCALE_CHECK'",
            "import sys",
            "from tfscale.exchange.horovod_runtime import built",
            f"if not built({needs!r}):",
            f'    sys.exit("error: this Horovod was built without {needs.upper()}; rebuild it '
            f'with: {hint} (see BUILD.md)")',
            "TFSCALE_CHECK"]


def job_script(req: JobRequest, header: Sequence[str], rank: str, launch: Sequence[str],
               setup_extra: Sequence[str] = (), after: Sequence[str] = ()) -> str:
    """The whole job script.

    Args:
        req: the request.
        header: scheduler directives (``#SBATCH ...``), without the shebang.
        rank: the per-rank wrapper (:func:`rank_script`).
        launch: the launcher's command, one part (option and value) per item.
        setup_extra: lines after the user's set-up lines (pre-flight checks, variables).
        after: lines run after the launcher returns, with its exit code in ``$status``.
    """
    gpus = (f"{req.gpus_per_rank} GPU(s)" if req.gpus_per_node else "no GPU")
    cores = f"{req.cores_per_rank} core(s)" if req.cores_per_rank else "an equal share of cores"
    summary = (f"{req.nodes} node(s) x {req.ranks_per_node} rank(s) = {req.total_ranks} "
               f"ranks, each with {gpus} and {cores}; --strategy={req.strategy}")
    lines = ["#!/usr/bin/env bash", *header,
             f"# tfscale job: {summary}."]
    if req.comment:
        lines.append(f"# {req.comment}")
    lines += ["set -euo pipefail", f"cd {shlex.quote(req.workdir)}", *req.setup]
    if os.path.isabs(req.python):
        lines += ["# The Python environment's tools (horovodrun) first on the PATH.",
                  f'export PATH={shlex.quote(os.path.dirname(req.python))}:"$PATH"']
    lines += [
              f'LOG_DIR="{req.log_dir}/{req.job_name}-{JOB_ID}"', 'mkdir -p "$LOG_DIR"',
              f"cat >\"$LOG_DIR/rank.sh\" <<'{RANK_SCRIPT_END}'", rank.rstrip("\n"),
              RANK_SCRIPT_END, 'chmod +x "$LOG_DIR/rank.sh"', *setup_extra,
              f'echo "[tfscale] {summary}; per-rank logs: $LOG_DIR/rank-<rank>.log"',
              "status=0", command(list(launch)) + " || status=$?", *after,
              'if [ "$status" -ne 0 ]; then',
              '  echo "[tfscale] the launcher exited with status $status; the end of each '
              'rank\'s log:" >&2',
              '  tail -n 5 "$LOG_DIR"/rank-*.log >&2 || true',
              "else",
              "  sed -n '/== tfscale summary ==/,$p' \"$LOG_DIR/rank-0.log\" || true",
              "fi",
              'exit "$status"']
    return "\n".join(lines) + "\n"
