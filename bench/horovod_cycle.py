"""What Horovod's background thread costs a CPU worker when it carries nothing: each rank's CPU
time, in % of one core, while two ranks on one node sit idle, for several cycle times.

Horovod's background thread wakes every cycle and coordinates with the other ranks even when
no tensor is waiting. A worker bound to one core loses that time from its compute. tfscale sets
5 ms on CPU workers, and 50 ms when every collective of the training takes shared memory
(:mod:`tfscale.strategies.horovod`). The workers run Horovod's Gloo controller, as
``--num_processes`` starts them; cycle times alternate in order over the rounds.

    python -m bench.horovod_cycle [--rounds 3 --seconds 8 --cycles 1,5,20,50,200]

About 2 minutes on 2 cores with the defaults.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import resource
import statistics
import sys
import time
from typing import Any

from bench.common import cpu_description, in_round_order, save, table
from tfscale.scripts.launcher import horovod_envs, node_layout, supervise

CYCLES_MS = (1.0, 5.0, 20.0, 50.0, 200.0)


def worker(seconds: float) -> None:
    """One rank: starts Horovod, runs one collective, then sleeps ``seconds`` and prints the
    CPU time this process used meanwhile (Horovod's thread, and TensorFlow's idle ones)."""
    import horovod.tensorflow as hvd

    hvd.init()
    import tensorflow as tf

    hvd.allreduce(tf.constant([1.0]), name="start")

    def used() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    before, start = used(), time.perf_counter()
    time.sleep(seconds)
    percent = 100 * (used() - before) / (time.perf_counter() - start)
    hvd.allreduce(tf.constant([1.0]), name="end")
    print("CYCLE_CPU " + json.dumps({"rank": hvd.rank(), "core_percent": percent}), flush=True)


def idle_cpu(cycle_ms: float, seconds: float) -> list[float]:
    """Each rank's CPU use (% of a core) with Horovod's cycle at ``cycle_ms``."""
    envs, server = horovod_envs(node_layout(2, 2))
    envs = [{**env, "HOROVOD_CYCLE_TIME": f"{cycle_ms:g}", "TF_CPP_MIN_LOG_LEVEL": "2"}
            for env in envs]
    log = io.StringIO()
    code = supervise([sys.executable, "-m", "bench.horovod_cycle", "--worker",
                      f"--seconds={seconds}"], envs, out=log, on_exit=server.stop)
    found = [json.loads(line.split("CYCLE_CPU ", 1)[1]) for line in log.getvalue().splitlines()
             if "CYCLE_CPU " in line]
    if code or len(found) != 2:
        raise RuntimeError(f"cycle {cycle_ms:g} ms failed ({code}):\n{log.getvalue()[-3000:]}")
    return [r["core_percent"] for r in sorted(found, key=lambda r: r["rank"])]


def measure(rounds: int, seconds: float, cycles: tuple[float, ...] = CYCLES_MS) -> dict[str, Any]:
    runs: dict[float, list[float]] = {c: [] for c in cycles}
    for round_ in range(rounds):
        for cycle in in_round_order(cycles, round_):
            runs[cycle] += idle_cpu(cycle, seconds)
    rows = [{"cycle_ms": c, "mean % of a core": statistics.mean(v),
             "min": min(v), "max": max(v), "samples": len(v)} for c, v in runs.items()]
    return {"cpu": cpu_description(), "rows": rows,
            "setup": {"ranks": 2, "seconds": seconds, "rounds": rounds}}


def report(result: dict[str, Any]) -> str:
    setup = result["setup"]
    return "\n".join([
        f"CPU: {result['cpu']}", "",
        f"{setup['ranks']} idle Horovod ranks on one node (Gloo), {setup['seconds']:g} s each, "
        f"{setup['rounds']} rounds; per-rank CPU time as % of one core (samples: ranks x "
        "rounds). tfscale's CPU defaults: 5 ms, and 50 ms when shared memory carries every "
        "collective during training.", "",
        table(result["rows"], ["cycle_ms", "mean % of a core", "min", "max", "samples"]),
    ])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--cycles", default=",".join(f"{c:g}" for c in CYCLES_MS))
    args = parser.parse_args()
    if args.worker:
        worker(args.seconds)
        return
    result = measure(args.rounds, args.seconds,
                     tuple(float(c) for c in args.cycles.split(",")))
    save("horovod_cycle", result)
    print(report(result))


if __name__ == "__main__":
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    main()
