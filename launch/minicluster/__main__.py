"""``python -m launch.minicluster up|down|status|exec``: see :mod:`launch.minicluster`."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import launch.minicluster as minicluster
from tfscale.cli.output import silence_stdout


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m launch.minicluster", description=minicluster.__doc__.split("\n\n")[0],
        epilog=minicluster.__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter)
    subs = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    start = subs.add_parser("up", help="start the cluster (installs its packages first time)")
    start.add_argument("--nodes", type=int, default=2, help="compute nodes (default 2)")
    subs.add_parser("down", help="stop everything and remove every trace")
    subs.add_parser("status", help="list the hosts and their state")
    run = subs.add_parser("exec", help="run a command on the head (or --on NODE) in the "
                          "cluster's environment, e.g. exec sbatch --wait job.sh")
    run.add_argument("--on", default=minicluster.HEAD, help="host to run on (default head)")
    run.add_argument("args", nargs=argparse.REMAINDER, metavar="COMMAND...")
    return parser


def _say(line: str) -> None:
    """``print``, except that a reader who went away (``status | head -1``) silences the rest
    instead of ending in a traceback: the exit code still says whether the cluster is up,
    which ``bench.shaped_links`` and scripts read."""
    try:
        print(line, flush=True)
    except BrokenPipeError:
        silence_stdout()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        if args.command == "up":
            minicluster.up(args.nodes)
            return 0
        if args.command == "down":
            return 1 if minicluster.down() else 0
        if args.command == "status":
            return minicluster.status(_say)
        command = args.args[1:] if args.args[:1] == ["--"] else args.args
        if not command:
            print("error: exec needs a command, e.g. exec sinfo", file=sys.stderr)
            return 2
        return minicluster.exec_command(command, args.on)
    except (RuntimeError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
