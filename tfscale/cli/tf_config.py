"""This process's place in its job as the launcher's variables say it, as JSON: what a job
script's ranks run to build their ``TF_CONFIG`` (``--tf_config``) under srun, mpirun or jsrun.

    python -m tfscale.cli.tf_config --tf_config --port 12345

(``python -m tfscale.cluster_env`` is the same command, as job scripts written before have it.)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from collections.abc import Sequence

from tfscale.cluster import environment


def main(argv: Sequence[str] | None = None) -> int:
    """Prints the detected environment, or ``--tf_config`` for this rank, as JSON."""
    parser = argparse.ArgumentParser(prog="python -m tfscale.cli.tf_config",
                                     description=__doc__.splitlines()[0])
    parser.add_argument("--tf_config", action="store_true",
                        help="print this rank's TF_CONFIG (multi-worker) instead")
    parser.add_argument("--port", type=int, default=environment.DEFAULT_PORT,
                        help="first port of the workers on each node")
    parser.add_argument("--hosts", default="",
                        help="the job's hosts in rank order (Slurm syntax), for launchers "
                             "whose variables do not list them (mpirun)")
    parser.add_argument("--ranks_per_node", type=int, default=0,
                        help="ranks on every host, for launchers whose variables do not say "
                             "(mpirun, jsrun); ranks fill one host before the next")
    args = parser.parse_args(argv)
    try:
        env = environment.detect()
        if args.hosts:
            env = dataclasses.replace(env, hosts=tuple(environment.expand_hostlist(args.hosts)),
                                      tasks_per_node=(), node_index=-1)
        if args.ranks_per_node:
            env = dataclasses.replace(env, tasks_per_node=(args.ranks_per_node,) * len(env.hosts),
                                      distribution="block")
        out = environment.tf_config(env, args.port) if args.tf_config else dataclasses.asdict(env)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
