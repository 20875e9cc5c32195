"""Runs a command as ``--np`` Horovod processes on simulated nodes of ``--per_node`` each.

horovodrun cannot make one machine look like several nodes; ``tfscale.scripts.launcher`` can
(distinct host
names per node). Tests start this module through ``tests.conftest.run_process``, whose timeout
kills it, and its workers die with it (``PR_SET_PDEATHSIG``), so a hung collective cannot
outlive the test.

    python -m tests.workers.simulated_nodes --np 4 --per_node 2 -- python -m MODULE ARGS
"""

from __future__ import annotations

import argparse
import sys

from tfscale.scripts.launcher import horovod_envs, node_layout, supervise


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--np", type=int, required=True, help="number of processes")
    parser.add_argument("--per_node", type=int, required=True, help="processes per node")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    envs, server = horovod_envs(node_layout(args.np, args.per_node))
    return supervise(command, envs, on_exit=server.stop)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
