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
    python -m bench.grpc_link_time --report [--result FILE ...]   (a saved result's table;
                                                                 several: rounds pooled)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from typing import Any

from bench.common import (
    add_report_flags,
    cpu_description,
    gradient_bytes,
    in_round_order,
    print_saved_report,
    save,
    table,
)
from tfscale.cli.link_time import busbw_GBps
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


#: Timings per model of :func:`link_row`: the median of three, so that one slow timing (gRPC's
#: ran 3x slow once on the Zen 3, 2026-12-03) sets nothing alone.
LINK_TIMINGS = 3


def link_row(models: tuple[str, ...], count: int = LINK_TIMINGS) -> dict[str, Any]:
    """gRPC's flat ring across the link as it is shaped now, multiworker's 2x2 flat runs' own
    call in their shape (each node's two workers on its one core), as ``bench.shaped_links
    --grpc_across`` times it into each link row's ``"grpc_flat"``, charged to those runs: per
    model, ``count`` timings at its gradient size (:func:`time_across`), the models in turn;
    each size's bus bandwidth over the ring's four ranks from the median (nccl-tests'
    definition, as ``bench.link_allreduce_worker``); one ring (``"rings"``, as a
    ``"ring_pair"`` row has two)."""
    sizes = {model: gradient_bytes(model) for model in models}
    timings: dict[str, list[float]] = {model: [] for model in models}
    for _ in range(count):
        for model in models:
            timings[model].append(time_across(sizes[model]))
    ranks = LOCAL * NODES
    return {"rings": 1, "timings_s": timings,
            "sizes": [{"bytes": sizes[model], "model": model,
                       "seconds_per_call": statistics.median(times),
                       "busbw_GBps": busbw_GBps(sizes[model], statistics.median(times),
                                                 ranks)}
                      for model, times in timings.items()]}


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
    """Per model and link: ms per all-reduce (mean and range over the rounds); for a shaped
    link, what it adds to the same round's unshaped time (mean, and its range over the
    rounds: pairs within a round keep this VM's drift between rounds out), against the wire's
    own time."""
    rows = []
    shares = []
    models = sorted({run["model"] for run in result["runs"]})
    for model in models:
        added_ms = wire_ms = 0.0
        by_round: dict[int, dict[float, float]] = {}
        for run in result["runs"]:
            if run["model"] == model:
                by_round.setdefault(run["round"], {})[run["gbit"]] = run["seconds_per_call"]
        nbytes = next(run["nbytes"] for run in result["runs"] if run["model"] == model)
        for gbit in sorted({g for times in by_round.values() for g in times}):
            ms = [times[gbit] * 1e3 for times in by_round.values() if gbit in times]
            row: dict[str, Any] = {"model": model,
                                   "link": f"{gbit:g} Gbit/s" if gbit else "unshaped",
                                   "ms per all-reduce": statistics.mean(ms),
                                   "range": f"{min(ms):.1f}-{max(ms):.1f}", "rounds": len(ms)}
            pairs = [(times[gbit] - times[0.0]) * 1e3 for times in by_round.values()
                     if gbit and gbit in times and 0.0 in times]
            if pairs:
                wire = wire_s(nbytes, gbit) * 1e3
                added = statistics.mean(pairs)
                added_ms, wire_ms = added_ms + added, wire_ms + wire
                row.update({"added ms": added,
                            "added, per round": f"{min(pairs):.1f} to {max(pairs):.1f}",
                            "wire ms": wire, "added / wire": added / wire})
            rows.append(row)
        if wire_ms:
            shares.append(f"{model}: {added_ms:.2f} of {wire_ms:.2f} ms, "
                          f"{added_ms / wire_ms:.2f}")
    columns = ["model", "link", "ms per all-reduce", "range", "rounds", "added ms",
               "added, per round", "wire ms", "added / wire"]
    pooled_line = ("\nThe shaped links together, added against the wire's time: "
                   + "; ".join(shares) + "\n") if shares else ""
    return (f"CPU: {result['cpu']}; {result['rounds']} round(s)\n"
            + table(rows, columns) + pooled_line)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--links", default="25,10", help="Gbit/s, comma-separated")
    parser.add_argument("--models", default="mlp,resnet50")
    add_report_flags(parser)
    parser.add_argument("--worker", nargs=2, type=int, metavar=("NBYTES", "CALLS"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker)
        return 0
    if args.report:
        print_saved_report(parser, args.result, "grpc_link_time", report)
        return 0
    result = measure(args.rounds, [float(x) for x in args.links.split(",") if x.strip()],
                     [m.strip() for m in args.models.split(",") if m.strip()])
    save("grpc_link_time", result)
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
