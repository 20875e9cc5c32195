"""A plain script for the ``tfscale-run`` tests (no TensorFlow: it only looks around).

Each worker prints one ``seen {...}`` JSON line with what the launcher gave it (its variables,
its cores, its arguments, whether the Horovod rendezvous server answers), then behaves as
``--fail`` says:

- ``exit:R:C``: worker R exits with code C on the first attempt (``TFSCALE_RESTART=0``);
- ``kill:R``: worker R SIGKILLs itself on the first attempt;
- ``wait``: every worker waits for SIGTERM and exits 7 when it comes.

The others wait up to 60 s for the launcher to stop them on a failing first attempt, and exit
0 at once otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time

VARIABLES = ("TFSCALE_STRATEGY", "TFSCALE_RESTART", "TFSCALE_LAUNCHED", "TFSCALE_LOCAL_RANK",
             "TFSCALE_LOCAL_SIZE", "HOROVOD_RANK", "HOROVOD_SIZE", "HOROVOD_GLOO_RENDEZVOUS_PORT",
             "TF_CONFIG", "TF_NUM_INTRAOP_THREADS")


def _rendezvous_answers() -> bool | None:
    port = os.environ.get("HOROVOD_GLOO_RENDEZVOUS_PORT")
    if port is None:
        return None
    with socket.socket() as s:
        return s.connect_ex((os.environ["HOROVOD_GLOO_RENDEZVOUS_ADDR"], int(port))) == 0


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail", default="")
    args, rest = parser.parse_known_args()
    seen = {name: os.environ.get(name) for name in VARIABLES}
    seen.update(pid=os.getpid(), cores=sorted(os.sched_getaffinity(0)), args=rest,
                rendezvous=_rendezvous_answers())
    print("seen " + json.dumps(seen), flush=True)
    rank = int(os.environ.get("TFSCALE_LOCAL_RANK", "0"))
    first = os.environ.get("TFSCALE_RESTART") == "0"
    how, _, rest_of = args.fail.partition(":")
    if how == "wait":
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))
        print("waiting", flush=True)
        time.sleep(60)
        return 1
    if first and how == "kill" and rank == int(rest_of):
        os.kill(os.getpid(), signal.SIGKILL)
    if first and how == "exit" and rank == int(rest_of.split(":")[0]):
        return int(rest_of.split(":")[1])
    if first and how:
        time.sleep(60)
    return 0


if __name__ == "__main__":
    sys.exit(main())
