"""Write a ready job script for a ``tfscale.train`` command line.

Usage::

    python -m launch.jobscript LAUNCHER [options] -- [tfscale.train flags]

    # Slurm, 4 nodes x 6 GPUs = 24 Horovod ranks:
    python -m launch.jobscript slurm --nodes 4 --gpus_per_node 6 --time 02:00:00 \\
        --account abc123 -o job.sbatch -- --model resnet50 --strategy horovod
    # Summit (LSF + jsrun), 6 GPUs a node:
    python -m launch.jobscript lsf --nodes 2 --gpus_per_node 6 --account ABC123 \\
        --stage_dir '/mnt/bb/$USER' -- --model resnet50 --strategy ddl --data_dir /data
    # mpirun / horovodrun on listed hosts; a ddlrun-style front end:
    python -m launch.jobscript mpirun -H gpu1:4,gpu2:4 --gpus_per_node 4 -- --strategy horovod
    python -m launch.jobscript ddlrun -H gpu1,gpu2 --accelerators 4 -- --model resnet50

The script goes to ``-o FILE`` (made executable) or to stdout. An impossible request fails
with exit code 2 and one line saying why.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tfscale.cli import command, output

# Before launch.jobs imports models (through tfscale.cli.plugins): python -m puts the user's
# directory, which may have its own models/ package, first on sys.path.
command.own_top_level_packages()

from launch.jobs import (  # noqa: E402
    GENERATORS,
    JobRequest,
    Knobs,
    ddlrun_request,
    render,
    request,
)
from launch.jobs.ddl import BACKENDS  # noqa: E402
from launch.jobs.spec import NCCL_DEBUG_LEVELS, parse_hosts, read_hostfile  # noqa: E402

PROGRAM = "python -m launch.jobscript"

# Request fields set from options of the same name (None = not given: the launcher's default).
_FIELDS = ("nodes", "gpus_per_node", "gpus_per_rank", "ranks_per_node", "node_gpus",
           "cores_per_node", "cores_per_rank", "time", "account", "queue", "job_name",
           "workdir", "python", "log_dir", "stage_dir", "port", "iface", "srun_mpi")


def _common(parser: argparse.ArgumentParser) -> None:
    add = parser.add_argument
    add("-o", "--output", help="write the script here (default: stdout)")
    add("--nodes", type=int, help="nodes in the job (default 1; the host count with -H)")
    add("--gpus_per_node", type=int, help="GPUs used on each node; 0 = CPU-only ranks")
    add("--gpus_per_rank", type=int, help="GPUs of each rank (default 1; Horovod/DDL: 1)")
    add("--ranks_per_node", type=int, help="ranks per node for CPU-only jobs (with GPUs: "
        "GPUs per node / GPUs per rank)")
    add("--node_gpus", type=int, help="GPUs a node has, to refuse asking for more")
    add("--cores_per_node", type=int, help="cores a node has (default: counted at run time)")
    add("--cores_per_rank", type=int, help="cores bound to each rank (default: a node's "
        "cores / its ranks)")
    add("--time", help="wall-time limit: HH:MM:SS, D-HH:MM:SS or minutes (default 01:00:00)")
    add("--account", help="account / project to charge")
    add("--queue", "--partition", dest="queue", help="Slurm partition or LSF queue")
    add("--job_name", help="job name, also the log directory's prefix (default tfscale)")
    add("--workdir", help="directory the ranks run in (default: here, the tfscale checkout)")
    add("--python", help=f"Python on the nodes (default: this one, {sys.executable})")
    add("--setup", action="append", default=[], help="a shell line run before launching, "
        "e.g. 'module load cuda' (repeatable)")
    add("--log_dir", help="parent of each job's log directory (default logs)")
    add("--stage_dir", help="node-local directory for tfscale.train --stage_dir, expanded on "
        "the node, e.g. '/mnt/bb/$USER' or '$TMPDIR/data'")
    add("--port", type=int, help="first TF_CONFIG port on each node (multiworker)")
    add("--iface", help="network interface for MPI/Gloo traffic, e.g. ib0")
    add("--srun_mpi", help="slurm: srun --mpi plugin for MPI-built Horovod (default pmix)")
    add("--fusion_threshold_mb", type=float, default=-1.0,
        help="HOROVOD_FUSION_THRESHOLD in MiB, for Horovod strategies (default: the train "
        "flags' --fusion_threshold_mb, else Horovod's)")
    add("--cycle_time_ms", type=float, default=-1.0,
        help="HOROVOD_CYCLE_TIME in ms, for Horovod strategies (default: the train flags' "
        "--cycle_time_ms, else Horovod's)")
    add("--hierarchical_allreduce", action="store_true", help="HOROVOD_HIERARCHICAL_ALLREDUCE=1")
    add("--nccl_debug", default="", choices=NCCL_DEBUG_LEVELS, help="NCCL_DEBUG level")
    add("--tf_log_level", type=int, default=2, help="TF_CPP_MIN_LOG_LEVEL (default 2)")


def build_parser(prog: str = PROGRAM) -> argparse.ArgumentParser:
    """The command line: one sub-command per launcher, plus ``ddlrun``; ``prog`` is the
    command's name in its help (``tfscale-jobscript`` when installed)."""
    doc = __doc__.replace(PROGRAM, prog)
    parser = argparse.ArgumentParser(
        prog=prog, formatter_class=argparse.RawDescriptionHelpFormatter,
        description=doc.split("\n\n")[0], epilog=doc.split("\n\n", 1)[1])
    subs = parser.add_subparsers(dest="launcher", required=True, metavar="LAUNCHER")
    for entry in GENERATORS:
        sub = subs.add_parser(entry.name, help=entry.description)
        _common(sub)
        if entry.name in ("mpirun", "horovodrun"):
            sub.add_argument("-H", "--hosts", help="host1:slots,host2:slots (default localhost)")
            sub.add_argument("--hostfile", help="MPI host file (host slots=N per line)")
        if entry.name == "horovodrun":
            sub.add_argument("--mpi", action="store_true", help="MPI instead of Gloo")
    ddl = subs.add_parser("ddlrun", help="ddlrun-style -H host1,host2: mpirun (or horovodrun) "
                          "with one rank per GPU and --strategy ddl")
    _common(ddl)
    ddl.add_argument("-H", "--hosts", help="host1,host2 (ddlrun's -H)")
    ddl.add_argument("--hostfile", help="host file, one host per line")
    ddl.add_argument("--accelerators", type=int, default=0, help="GPUs per host (one rank each)")
    ddl.add_argument("--backend", choices=BACKENDS, default="mpirun", help="launcher to use")
    return parser


def make_request(args: argparse.Namespace, train_args: tuple[str, ...],
                 comment: str = "") -> JobRequest:
    """The validated JobRequest for parsed options (raises ValueError when impossible)."""
    fields: dict[str, Any] = {f: getattr(args, f) for f in _FIELDS
                              if getattr(args, f, None) is not None}
    fields["comment"] = comment
    fields.setdefault("python", sys.executable)
    fields["workdir"] = os.path.abspath(fields.get("workdir", os.getcwd()))
    fields["setup"] = tuple(args.setup)
    fields["knobs"] = Knobs(args.fusion_threshold_mb, args.cycle_time_ms,
                            args.hierarchical_allreduce, args.nccl_debug, args.tf_log_level)
    hosts = args.hosts if getattr(args, "hosts", None) else ""
    if getattr(args, "hostfile", None):
        if hosts:
            raise ValueError("give the hosts once: -H or --hostfile")
        hosts = read_hostfile(args.hostfile)
    if args.launcher == "ddlrun":
        if not hosts:
            raise ValueError("ddlrun needs the hosts: -H host1,host2 or --hostfile")
        fields.pop("gpus_per_node", None)
        return ddlrun_request(hosts, args.accelerators, args.backend, train_args, **fields)
    if hosts:
        fields["hosts"] = parse_hosts(hosts)
    if args.launcher == "horovodrun":
        fields["mpi"] = args.mpi
    return request(args.launcher, train_args=train_args, **fields)


@output.ends_quietly
def main(argv: Sequence[str] | None = None, prog: str = PROGRAM) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    cut = argv.index("--") if "--" in argv else len(argv)
    args = build_parser(prog).parse_args(argv[:cut])
    train_args = tuple(argv[cut + 1:])
    comment = f"Written by: {prog} " + shlex.join(argv)
    try:
        req = make_request(args, train_args, comment)
        text = render(req)
    except (ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.output:
        try:
            os.makedirs(os.path.dirname(os.path.abspath(args.output)), exist_ok=True)
            with open(args.output, "w") as f:
                f.write(text)
        except OSError as err:
            print(f"error: cannot write the job script to -o {args.output}: {err.strerror}",
                  file=sys.stderr)
            return 2
        os.chmod(args.output, 0o755)
        print(f"wrote {args.output}: {req.total_ranks} ranks on {req.nodes} node(s), "
              f"--strategy={req.strategy}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0


def script() -> int:
    """The installed ``tfscale-jobscript`` command: ``main`` under the script's name."""
    return main(prog=Path(sys.argv[0]).name)


if __name__ == "__main__":
    sys.exit(main())
