"""Gradient lag (``--gradient_lag=1``): 2-worker scaling of the communication-bound ``mlp``.

Weak-scaling efficiency = images/s of 2 workers / (2 x images/s of ``default`` on one core),
every worker bound to its own core and running one TensorFlow thread of each kind, for
``horovod`` and ``ddl`` with and without the lag. The runs alternate within each round, so
drift in the machine's speed hits all alike; figures are means over rounds, with the range.

With the lag, step t all-reduces the gradients of step t-1, which nothing in step t computes,
so the exchange can run while step t's forward and backward pass compute; without it the
exchange waits for the backward pass and the update waits for the exchange.

    python -m bench.gradient_lag [--rounds 3 --steps 300]

About 6 minutes on 2 cores. The effect on accuracy is measured by ``python -m bench.accuracy
--runs "horovod x2 gradient lag"`` (digits, 30 epochs).
"""

from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

from bench.common import cpu_description, save, table, train

MLP = ["--model=mlp", "--image_size=32", "--batch_size=64", "--intra_op_threads=1",
       "--inter_op_threads=1"]
TWO = ["--num_processes=2", "--cpu_binding"]
RUNS: dict[str, list[str]] = {
    "default (1 core)": ["--strategy=default"],
    "horovod x2": ["--strategy=horovod", *TWO],
    "horovod x2 lag": ["--strategy=horovod", *TWO, "--gradient_lag=1"],
    "ddl x2": ["--strategy=ddl", "--ddl_local_size=1", *TWO],
    "ddl x2 lag": ["--strategy=ddl", "--ddl_local_size=1", *TWO, "--gradient_lag=1"],
}


def measure(rounds: int, steps: int, names: list[str]) -> dict[str, Any]:
    one_core = sorted(os.sched_getaffinity(0))[:1]
    rows = []
    for round_ in range(1, rounds + 1):
        for name in names:
            workers = 2 if "x2" in name else 1
            out = train([*MLP, *RUNS[name], f"--steps={steps}", f"--log_every={steps}"],
                        cores=one_core if workers == 1 else None)
            rows.append({"round": round_, "run": name, "workers": workers,
                         "images_per_sec": out["images_per_sec"],
                         "step_time_ms": out["step_time_ms"]})
    base = statistics.mean(r["images_per_sec"] for r in rows if r["workers"] == 1)
    summary = []
    for name in names:
        mine = [r for r in rows if r["run"] == name]
        rates = [r["images_per_sec"] for r in mine]
        efficiency = [rate / (mine[0]["workers"] * base) for rate in rates]
        summary.append({"run": name, "images_per_sec": statistics.mean(rates),
                        "step_time_ms": statistics.mean(r["step_time_ms"] for r in mine),
                        "efficiency": statistics.mean(efficiency),
                        "efficiency range": f"{min(efficiency):.2f}-{max(efficiency):.2f}"})
    return {"cpu": cpu_description(), "rows": rows, "summary": summary,
            "setup": {"model": "mlp", "batch_size_per_worker": 64, "image_size": 32,
                      "steps": steps, "rounds": rounds, "threads_per_worker": 1}}


def report(result: dict[str, Any]) -> str:
    return "\n".join([
        f"CPU: {result['cpu']}", "",
        table(result["rows"], ["round", "run", "images_per_sec", "step_time_ms"]), "",
        table(result["summary"], ["run", "images_per_sec", "step_time_ms", "efficiency",
                                  "efficiency range"]),
    ])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--runs", default=",".join(RUNS), help="comma-separated run names")
    args = parser.parse_args()
    names = args.runs.split(",")
    unknown = sorted(set(names) - set(RUNS))
    if unknown or not any(name.startswith("default") for name in names):
        parser.error(f"--runs: unknown {unknown} or no default run; choose from {list(RUNS)}")
    result = measure(args.rounds, args.steps, names)
    save("gradient_lag", result)
    print(report(result))


if __name__ == "__main__":
    main()
