"""gRPC's flat ring across the mini-cluster's shaped link: does the wire's time add to its host
work, or hide behind it?

``tfscale.forecast`` takes the longer of an all-reduce's wire time and its host time where a
node's ranks share a core. Three EPYC sets of ``bench.shaped_links`` ran multiworker's flat
ring (TensorFlow's gRPC collective) slower at 10 Gbit/s than at 25 for mlp, where the host time
hides the wire's in that model (docs/FORECAST.md, "The gRPC figure timed at each round's start
and end"). This bench times the collective itself across the link, with no training: on the
two-node mini-cluster, ``srun -N2 --ntasks-per-node=2`` starts four TF_CONFIG workers (the
flat ring of a 2x2 run, each node's two on its one core), each all-reducing a model's gradient
bytes over and over (:func:`tfscale.exchange.host_time.seconds_per_call`). For each link
speed (unshaped, 25 and 10 Gbit/s, the order alternating by round) it reports seconds per
all-reduce, and against the unshaped time the time the shaped link adds, beside the wire's own
time at the link's rate (:func:`tfscale.forecast.model.flat_allreduce_s` with the rate and no
latency): "added / wire" near 1 means the wire adds, near 0 that it hides.

    python -m bench.grpc_link_time [--rounds 2] [--links 25,10] [--models mlp,resnet50]  (root)
    python -m bench.grpc_link_time --report [--result FILE]   (the table of a saved result)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.common import OUT, cpu_description, gradient_bytes, in_round_order, save, table
from tfscale.forecast.model import FLAT_RING_LOCAL, FLAT_RING_NODES

PORT = 47311
LOCAL, NODES = FLAT_RING_LOCAL, FLAT_RING_NODES  # a 2x2 run's flat ring
_SECONDS = 4.0  # of all-reduces per timing
_NS_PER_STACK_BYTE = 2.5  # roughly, at 2 ranks per core: sizes a timing to about _SECONDS


def worker(nbytes: int, calls: int) -> None:
    """One rank under ``srun``: its TF_CONFIG from Slurm's variables, as multiworker builds
    it; prints its seconds per all-reduce as one JSON line."""
    from tfscale.cluster import environment
    from tfscale.exchange.host_time import seconds_per_call

    os.environ["TF_CONFIG"] = json.dumps(environment.tf_config(environment.detect(), PORT))
    print(json.dumps({"seconds_per_call": seconds_per_call("grpc", nbytes, calls)}), flush=True)


def time_across(nbytes: int) -> float:
    """Seconds per all-reduce of ``nbytes`` by the four workers across the link as it is
    shaped now (the slowest rank's)."""
    from bench.shaped_links import _cluster
    from tfscale.forecast.model import host_bytes

    calls = max(3, round(_SECONDS / (host_bytes(nbytes, "flat", LOCAL, NODES, "tcp")
                                     * _NS_PER_STACK_BYTE * 1e-9)))
    proc = _cluster("srun", f"-N{NODES}", f"--ntasks-per-node={LOCAL}", "--kill-on-bad-exit=1",
                    sys.executable, "-m", "bench.grpc_link_time", "--worker", str(nbytes),
                    str(calls), timeout=900)
    if proc.returncode:
        raise RuntimeError(f"the gRPC ring across the link failed (exit {proc.returncode}):\n"
                           f"{proc.stdout[-1500:]}{proc.stderr[-1500:]}")
    times = [json.loads(line)["seconds_per_call"] for line in proc.stdout.splitlines()
             if line.startswith("{")]
    if len(times) != LOCAL * NODES:
        raise RuntimeError(f"expected {LOCAL * NODES} workers' times, got {proc.stdout[-1500:]}")
    return max(times)


def wire_s(nbytes: int, gbit: float) -> float:
    """The flat ring's time on the wire alone at ``gbit`` (its hops across, at the rate)."""
    from tfscale.forecast.model import Link, flat_allreduce_s

    return flat_allreduce_s(nbytes, LOCAL, NODES, Link(1e9, 0.0), Link(gbit / 8, 0.0))


def measure(rounds: int, links: list[float], models: list[str]) -> dict[str, Any]:
    from bench.shaped_links import shape, two_nodes

    sizes = {model: gradient_bytes(model) for model in models}
    runs: list[dict[str, Any]] = []
    with two_nodes():
        for r in range(rounds):
            for gbit in in_round_order([0.0, *links], r):
                shape(gbit)
                for model in in_round_order(models, r):
                    runs.append({"round": r, "gbit": gbit, "model": model,
                                 "nbytes": sizes[model],
                                 "seconds_per_call": time_across(sizes[model])})
                    print(json.dumps(runs[-1]), flush=True)
        shape(0)
    return {"cpu": cpu_description(), "rounds": rounds, "runs": runs}


def report(result: dict[str, Any]) -> str:
    rows = []
    models = sorted({run["model"] for run in result["runs"]})
    for model in models:
        def mean_s(gbit: float, model: str = model) -> float:
            return statistics.mean(run["seconds_per_call"] for run in result["runs"]
                                   if run["model"] == model and run["gbit"] == gbit)
        nbytes = next(run["nbytes"] for run in result["runs"] if run["model"] == model)
        base = mean_s(0.0)
        for gbit in sorted({run["gbit"] for run in result["runs"]}):
            row: dict[str, Any] = {"model": model,
                                   "link": f"{gbit:g} Gbit/s" if gbit else "unshaped",
                                   "ms per all-reduce": mean_s(gbit) * 1e3}
            if gbit:
                wire = wire_s(nbytes, gbit)
                row.update({"added ms": (mean_s(gbit) - base) * 1e3, "wire ms": wire * 1e3,
                            "added / wire": (mean_s(gbit) - base) / wire})
            rows.append(row)
    columns = ["model", "link", "ms per all-reduce", "added ms", "wire ms", "added / wire"]
    return (f"CPU: {result['cpu']}; {result['rounds']} round(s)\n"
            + table(rows, columns))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--links", default="25,10", help="Gbit/s, comma-separated")
    parser.add_argument("--models", default="mlp,resnet50")
    parser.add_argument("--report", action="store_true", help="only the table of --result")
    parser.add_argument("--result", type=Path, default=OUT / "grpc_link_time.json",
                        help="with --report: a saved result (default: the last run's)")
    parser.add_argument("--worker", nargs=2, type=int, metavar=("NBYTES", "CALLS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return 0
    if args.report:
        if not args.result.exists():
            parser.error(f"--report: no result at {args.result}; run without --report first")
        print(report(json.loads(args.result.read_text())))
        return 0
    result = measure(args.rounds, [float(x) for x in args.links.split(",") if x.strip()],
                     [m.strip() for m in args.models.split(",") if m.strip()])
    save("grpc_link_time", result)
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
