"""gRPC's host time per byte in the flat ring's own topology, at each model's gradient size.

``bench.transport_host_time`` times TensorFlow's gRPC collective between two workers on one
core. A 2x2 run of ``--strategy=multiworker --node_exchange=collectives`` is one gRPC ring
over four workers, two on each node's core. This bench runs that ring with no link between the
nodes (``python -m tfscale.cli.host_time grpc NBYTES --flat_ring``, which ``tfscale.forecast
--calibrate`` also runs): four TF_CONFIG workers, each "node's" two pinned to one core of this
machine (ranks 0 and 1 on the first, 2 and 3 on the second, the ring's order, so it crosses
between the cores twice). Each all-reduce has the size of a model's gradients
(``tfscale.forecast`` presets' ``gradient_bytes``). The figure is nanoseconds per byte that
one node's ranks put through the network stack (``tfscale.forecast.model.host_bytes``:
``2 x 1.5 n`` per all-reduce of ``n``). The rounds alternate the models' order.

    python -m bench.grpc_ring_host_time [--rounds 2] [--models mlp,resnet50]
    python -m bench.grpc_ring_host_time --report --result FILE   # what-if on a kept set

``--report`` charges the multiworker flat runs of a kept ``bench.shaped_links`` set these
figures, for their gRPC host time, in place of each round's two-worker figure (sets measured
since 2026-11-28 evening take them in each round: ``grpc_ring_ns_per_stack_byte``). The report
names them a what-if: they were measured on another day than the set.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from bench.common import OUT, cpu_description, gradient_bytes, in_round_order, save, table
from tfscale.cli.host_time import flat_ring


def measure(rounds: int, models: list[str]) -> dict[str, Any]:
    sizes = {model: gradient_bytes(model) for model in models}
    runs: list[dict[str, Any]] = []
    for r in range(rounds):
        for model in in_round_order(models, r):
            runs.append({"round": r, "model": model, "nbytes": sizes[model],
                         "ns_per_stack_byte": flat_ring(sizes[model])})
            print(json.dumps(runs[-1]), flush=True)
    figures = {model: statistics.median(run["ns_per_stack_byte"] for run in runs
                                        if run["model"] == model) for model in models}
    return {"cpu": cpu_description(), "rounds": rounds, "runs": runs, "figures": figures}


def what_if(kept: dict[str, Any], figures: dict[str, float]) -> str:
    """The kept set's multiworker flat runs, forecast with each round's own figures and with
    ``figures`` (ns per stack byte, by model) as their gRPC host time."""
    from bench.shaped_links import ACROSS
    from bench.shaped_links_report import _links_by_round, forecast_rate, rate_of

    layout = next(layout for layout in ACROSS if layout.name == "2x2 multiworker flat")
    links = _links_by_round(kept)
    runs = {(run["round"], run["gbit"], run["model"], run["layout"]): run for run in kept["runs"]}
    batch = {model: int(next(flag.split("=")[1] for flag in flags
                             if flag.startswith("--batch_size=")))
             for model, flags in kept["models"].items()}
    rows = []
    for model, gbit in sorted({(m, g) for (_, g, m, name) in runs if name == layout.name}):
        measured, rounds_own, topology = [], [], []
        for r in sorted(links):
            run = runs.get((r, gbit, model, layout.name))
            node = runs.get((r, 0.0, model, "1x2"))
            if (run is None or node is None or model not in figures
                    or "idle_ns_per_byte" not in links[r][0.0]):
                continue  # older sets: no round figures of their own to compare with
            measured.append(rate_of(run))
            rounds_own.append(forecast_rate(gbit, model, layout, rate_of(node), links[r],
                                            batch[model]))
            mine = {**links[r], 0.0: {**links[r][0.0],
                                     "grpc_ring_ns_per_stack_byte": {model: figures[model]}}}
            topology.append(forecast_rate(gbit, model, layout, rate_of(node), mine,
                                          batch[model]))
        if not measured:
            continue
        mean = statistics.mean(measured)
        rows.append({"model": model, "link": f"{gbit:g} Gbit/s", "measured images/s": mean,
                     "rounds": len(measured),
                     "round's 2-worker figure": f"{statistics.mean(rounds_own) / mean - 1:+.1%}",
                     "this topology figure (what-if)":
                         f"{statistics.mean(topology) / mean - 1:+.1%}"})
    if not rows:
        return ("no multiworker flat run with its round's transport figures in this set (sets "
                "from 2026-11-28 on have them)")
    return table(rows, list(rows[0]))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--models", default="mlp,resnet50")
    parser.add_argument("--report", action="store_true",
                        help="only the what-if of --result with the last run's figures")
    parser.add_argument("--result", type=Path, help="a kept bench.shaped_links set")
    args = parser.parse_args()
    if args.report:
        if not args.result:
            parser.error("--report needs --result FILE (a kept bench.shaped_links set)")
        saved = OUT / "grpc_ring_host_time.json"
        if not saved.exists():
            parser.error(f"--report: no figures measured yet ({saved}); run without --report")
        result = json.loads(saved.read_text())
    else:
        result = measure(args.rounds, [m.strip() for m in args.models.split(",") if m.strip()])
        save("grpc_ring_host_time", result)
    print(f"CPU: {result['cpu']}; {result['rounds']} round(s); ns per stack byte: "
          + ", ".join(f"{model} {ns:.2f}" for model, ns in result["figures"].items()))
    if args.result:
        print(what_if(json.loads(args.result.read_text()), result["figures"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
