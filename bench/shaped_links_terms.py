"""The forecast's host-time and straggler terms against the recorded shaped-link runs.

``bench.shaped_links`` keeps its raw results out of the repository (bench/results/); this check
reads the runs as bench/RESULTS.md recorded them (docs/forecast/shaped_links_2026-11-26.json:
each run's measured images/s per round and the forecast it had then) and forecasts them again
with what the forecast now knows (docs/FORECAST.md, "The model"), through the same plan as
``bench.shaped_links_report.forecast_rate``:

- **host time**: where a node's ranks outnumber its cores, a message takes the longer of its
  alpha-beta time and the host time of every byte the node's ranks put through the transport
  at the preset's ``exchange.host_ns_per_byte``, measured by ``--calibrate`` on this node (a
  busy core), never on a two-node run; only the bytes that go through the network stack
  (``bench.shaped_links_report.plan_for``'s transport: a flat ring's in-node hops are Open
  MPI's shared memory under horovod and ddl, loopback TCP under multiworker);
- **stragglers**: the step waits for the slowest of the ``2L`` ranks instead of ``L``, with
  the preset's ``stragglers.step_cv`` (``--calibrate``'s spread of step times).

The record keeps each run's forecast but not every link figure it used (the bus bandwidth at
4 MiB is not in RESULTS.md): the cross-node bandwidth is recovered from the recorded forecast
(the one bandwidth with which the model, without the new terms, gives it again; bisection),
with the round's ping-pong latency and in-node bus bandwidth as recorded.

    python -m bench.shaped_links_terms
"""

from __future__ import annotations

import dataclasses
import json
import statistics
from typing import Any

from bench.common import ROOT, table
from bench.shaped_links import ACROSS
from bench.shaped_links_report import plan_for
from tfscale.forecast.machines import Machine, ModelFigures, load
from tfscale.forecast.model import Link
from tfscale.forecast.predict import forecast

DATA = ROOT / "docs" / "forecast" / "shaped_links_2026-11-26.json"
# Per round: the ping-pong latency (us) of each link and the in-node shared-memory bus
# bandwidth (GB/s) at the size the report takes for each model (16 MiB mlp, 64 MiB resnet50);
# bench/RESULTS.md (round 0: commit daab1fe's table; round 1: 2 x today's mean less round 0).
LATENCY_US = {0: {1: 33.3, 10: 37.2, 25: 40.9}, 1: {1: 40.1}}
IN_NODE_GBPS = {0: {"mlp": 3.04, "resnet50": 2.15}, 1: {"mlp": 2.38, "resnet50": 1.99}}


def _machine(gbit: int, model: str, local: int, node_rate: float, round_: int, batch: int,
             inter_GBps: float, terms: bool) -> Machine:
    base = load(f"minicluster_{gbit}gbit")
    figures = base.model(model)
    machine = dataclasses.replace(
        base, inter=Link(inter_GBps, LATENCY_US[round_][gbit]),
        intra=Link(IN_NODE_GBPS[round_][model], base.intra.latency_us),
        models={model: ModelFigures(figures.gradient_bytes, batch, local, {"fp32": node_rate},
                                    figures.backward_fraction, None, "bench.shaped_links")})
    return machine if terms else dataclasses.replace(machine, host_s_per_byte=0.0, step_cv=0.0)


def _rate(machine: Machine, model: str, layout: Any, batch: int) -> float:
    return forecast(plan_for(machine, model, layout, batch), [layout.nodes])[0].images_per_sec


def _bandwidth(target: float, args: tuple[int, str, int, float, int, int], layout: Any
               ) -> float:
    """The cross-node bandwidth (GB/s) with which the model without the new terms forecasts
    ``target`` images/s (bisection in log; the rate grows with the bandwidth)."""
    model, batch = args[1], args[-1]
    low, high = 1e-3, 1e2
    for _ in range(50):
        middle = (low * high) ** 0.5
        if _rate(_machine(*args, middle, False), model, layout, batch) < target:
            low = middle
        else:
            high = middle
    return (low * high) ** 0.5


def rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per two-node run: measured, forecast before and now (means over rounds)."""
    layouts = {layout.name: layout for layout in ACROSS}
    runs = {(r["model"], r["link"], r["run"]): r for r in doc["runs"]}
    out = []
    for (model, link, name), run in runs.items():
        if not link.endswith("Gbit/s"):
            continue
        gbit, layout, batch = int(link.split()[0]), layouts[name], doc["batch_size"][model]
        one_node = {r["round"]: r["measured"]
                    for r in runs[(model, "none (one node)", f"1x{layout.local}")]["rounds"]}
        measured, before, now, inter = [], [], [], []
        for r in run["rounds"]:
            args: tuple[int, str, int, float, int, int] = (
                gbit, model, layout.local, one_node[r["round"]], r["round"], batch)
            bandwidth = _bandwidth(r["forecast_before"], args, layout)
            measured.append(r["measured"])
            before.append(r["forecast_before"])
            now.append(_rate(_machine(*args, bandwidth, True), model, layout, batch))
            inter.append(bandwidth)
        seen = statistics.mean(measured)
        out.append({"model": model, "link": link, "run": name, "measured": seen,
                    "rounds": len(measured), "link GB/s": statistics.mean(inter),
                    "forecast images/s": statistics.mean(now),
                    "before": f"{statistics.mean(before) / seen - 1:+.1%}",
                    "now": f"{statistics.mean(now) / seen - 1:+.1%}"})
    return out


def main() -> None:
    doc = json.loads(DATA.read_text())
    found = rows(doc)
    print(table(found, ["model", "link", "run", "measured", "rounds", "link GB/s",
                        "forecast images/s", "before", "now"]))
    for key in ("before", "now"):
        errors = [float(r[key].rstrip("%")) for r in found]
        within = sum(abs(e) <= 10 for e in errors)
        worst = max(found, key=lambda r: abs(float(r[key].rstrip("%"))))
        print(f"{key}: {within} of {len(found)} within 10%; worst {worst[key]} "
              f"({worst['model']} {worst['link']} {worst['run']})")


if __name__ == "__main__":
    main()
