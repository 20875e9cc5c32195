"""Tables of bench.shaped_links: the links, each run against its floor and its forecast.

Kept apart from the measurement so that the tables can be remade from the saved JSON
(``python -m bench.shaped_links --report``) without a cluster.

- **Efficiency** is against one node with the same ranks per node, as published scaling tables
  count it: ``2xL images/s / (2 x 1xL images/s)``.
- **Floor**: the step time the link allows, ``L x the 1x1 step`` (the node's ranks share its one
  core) plus the bytes that cross the link per direction over the shaped rate: a flat ring over
  ``p`` ranks sends ``2(p-1)/p`` of the gradients over each node boundary, the hierarchical
  all-reduce ``2(C-1)/C`` of them over ``C`` nodes (its ``L`` shards of ``1/L`` together),
  fp16 half as much. ``of floor`` = measured images/s / the floor's.
- **ns per stack byte**: the run's own exchange time (its step less ``L x the 1x1 step``) over the
  bytes a node puts through the network stack (``tfscale.forecast.model.host_bytes``): what a
  byte cost, to set beside ``--calibrate``'s host time per byte.
- **Forecast**: ``tfscale.forecast``'s model on the preset ``minicluster_<N>gbit`` with its links
  and compute replaced by this round's own measurements: the bus bandwidth of the all-reduce
  across the link at the message size nearest to the run's (its fused gradients, or a node's
  1/L share of them when hierarchical) and the ping-pong latency, the shared-memory exchange
  inside a node, and the 1xL run's images/s (the 1-node figure, as for Summit). No 2-node run
  enters it. Where the set has them, a run's own one-node baseline (``--adjacent_baselines``)
  and its own figures (``--adjacent_figures``), timed just before it, replace the round's;
  where it also ran the baseline just after the run (``--bracketed_baselines``), the mean of
  the two.
- **Spread**: with several rounds, how far each round's efficiency lies from the same run's
  mean over the rounds. The forecast takes the baseline and predicts the run; where the
  measured ratio of the two moves by more than 10% between rounds, no forecast from the
  baseline is within 10% of every round.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from bench.common import table

GRADIENT_BYTES_SOURCE = "the preset's gradient_bytes (tfscale.forecast --calibrate)"


def _layouts() -> dict[str, Any]:
    from bench.shaped_links import ACROSS, ONE_NODE

    return {layout.name: layout for layout in (*ONE_NODE, *ACROSS)}


def crossing_bytes(gradient_bytes: float, nodes: int, local: int, algorithm: str,
                   fp16: bool) -> float:
    """Bytes one node sends over its link per step (per direction)."""
    if nodes <= 1:
        return 0.0
    if algorithm == "flat":
        ranks = nodes * local
        sent = 2 * (ranks - 1) / ranks * gradient_bytes
    else:
        sent = 2 * (nodes - 1) / nodes * gradient_bytes
    return sent / 2 if fp16 else sent


def _mean(values: list[float]) -> float:
    return statistics.mean(values) if values else float("nan")


def rate_of(run: dict[str, Any]) -> float:
    """A run's images/s: after its first progress interval where the result has it (sets from
    2026-11-28 on), else over all its timed steps. A one-node run that ran on both nodes at
    once counts as the mean of the two (the same job under the same conditions: two samples
    of the baseline)."""
    rate: float = run.get("steady_images_per_sec") or run["images_per_sec"]
    neighbour = run.get("neighbour_images_per_sec")
    return (rate + neighbour) / 2 if neighbour else rate


def _pair_rate(pair: list[float | None]) -> float:
    rate, neighbour = pair
    return rate_of({"images_per_sec": rate, "neighbour_images_per_sec": neighbour})


def baseline_of(run: dict[str, Any]) -> float | None:
    """The run's own one-node baseline where the set ran one just before it
    (``--adjacent_baselines``: the mean of its two nodes' rates), and where it also ran one
    just after it (``--bracketed_baselines``) the mean of the two; else None."""
    pair = run.get("baseline_images_per_sec")
    if not pair:
        return None
    after = run.get("after_baseline_images_per_sec")
    return (_pair_rate(pair) + _pair_rate(after)) / 2 if after else _pair_rate(pair)


def node_rate(run: dict[str, Any], round_rates: dict[tuple[float, str, str], float],
              model: str, local: int) -> float | None:
    """The one-node images/s a two-node run's forecast is calibrated on: its own baseline
    (:func:`baseline_of`), else its round's one-node run with the same ranks per node."""
    return baseline_of(run) or round_rates.get((0.0, model, f"1x{local}"))


def bracket_drift(run: dict[str, Any]) -> float | None:
    """How far the baseline after a run lies from the one before it, as a fraction of the
    one before (``--bracketed_baselines``): the VM's drift over the run's minutes."""
    pair, after = run.get("baseline_images_per_sec"), run.get("after_baseline_images_per_sec")
    return _pair_rate(after) / _pair_rate(pair) - 1 if pair and after else None


# A round's one-node figures given per model or per transport: a run's own timing replaces
# only its model's or transports' entries.
BY_NAME = ("cast_ns_per_byte", "idle_ns_per_byte", "grpc_ring_ns_per_stack_byte")


def links_of(run: dict[str, Any], links: dict[float, dict[str, Any]],
             ) -> dict[float, dict[str, Any]]:
    """One round's links as the run's forecast takes them: with the figures timed just before
    the run where the set has them (``--adjacent_figures``) in place of the round's, each
    by-model or by-transport figure one by one, else the round's own."""
    figures = run.get("figures")
    if not figures:
        return links
    gbit = run["gbit"]
    node = dict(links.get(0.0, {}))
    for key, value in figures["node"].items():
        node[key] = ({**node.get(key, {}), **value} if key in BY_NAME else value)
    return {**links, gbit: {**links.get(gbit, {}), **figures["link"]}, 0.0: node}


def _by_round(result: dict[str, Any]) -> dict[int, dict[tuple[float, str, str], float]]:
    runs: dict[int, dict[tuple[float, str, str], float]] = defaultdict(dict)
    for run in result["runs"]:
        runs[run["round"]][(run["gbit"], run["model"], run["layout"])] = rate_of(run)
    return runs


def _links_by_round(result: dict[str, Any]) -> dict[int, dict[float, dict[str, Any]]]:
    links: dict[int, dict[float, dict[str, Any]]] = defaultdict(dict)
    for row in result["links"]:
        links[row["round"]][row["gbit"]] = row
    return links


def _size_row(figures: dict[str, Any], nbytes: float = 64 * 2**20) -> dict[str, Any]:
    """The measured message size nearest to ``nbytes`` (in ratio)."""
    row: dict[str, Any] = min(figures["sizes"],
                              key=lambda s: abs(math.log(s["bytes"] / max(nbytes, 1.0))))
    return row


def rings_together(pair: dict[str, Any]) -> dict[str, Any]:
    """A timing of the rings that ran at once (``"ring_pair"``, ``bench.shaped_links.
    link_figures``; ``"grpc_flat"`` is one ring) as its node drives the link: each size's bus
    bandwidth times the rings, all rings' bytes."""
    return {**pair, "sizes": [{**size, "busbw_GBps": size["busbw_GBps"] * pair["rings"]}
                              for size in pair["sizes"]]}


def batch_of(flags: list[str]) -> int:
    """The per-rank batch size in a model's ``tfscale.train`` flags (``--batch_size=N``)."""
    return int(next(f.split("=", 1)[1] for f in flags if f.startswith("--batch_size=")))


def message_bytes(gradient_bytes: float, layout: Any) -> float:
    """What one all-reduce call of the run carries: every gradient, fused (flat), or a node's
    1/L share of them (hierarchical), half as many bytes in float16."""
    share = gradient_bytes / (layout.local if layout.algorithm == "hierarchical" else 1)
    return share / 2 if layout.fp16 else share


#: The calls across nodes (``bench.shaped_links.Layout.cross_call``) that their runs are charged
#: where the round timed them: multiworker's rings one per local index (since 2026-12-06) and
#: gRPC's flat ring over the 2x2 flat layout's ranks (``"grpc_flat"``, since 2026-12-07). A
#: set without the figure charges Open MPI's link figure, and for the flat ring gRPC's host
#: figure. Charged gRPC's call, the flat runs are 15 of 16 within 10% round by round on a Zen 3
#: and a Zen 4, against 13 of 16 on the older charge, which Open MPI's wire figure set too slow
#: on the Zen 4 at 1 Gbit/s (docs/FORECAST.md, "gRPC's flat ring charged as timed across").
CHARGED_CROSS_CALLS = ("ring_pair", "grpc_flat")

#: The whole exchanges (``bench.shaped_links.Layout.whole_call``) that their runs are charged
#: where the round timed them: multiworker's hierarchical exchange over the 2x2 ranks, its node
#: phases and its rings as a step calls them (since 2026-12-07 evening). A set without it
#: charges the node phases' figure and the rings' (``"ring_pair"``), which add to less: at 25
#: Gbit/s on a Zen 4 the whole call charged 1.2-1.5x their sum, and came within 8.4% of what
#: the steps waited in 7 of 8 rounds (docs/FORECAST.md, "multiworker's hierarchical exchange
#: timed whole").
CHARGED_WHOLE_CALLS = ("hierarchical_call",)


def machine_for(gbit: float, model: str, layout: Any, node_rate: float,
                links: dict[float, dict[str, Any]], batch_size: int,
                host_ns: Mapping[str, float] | None = None) -> Any:
    """The preset ``minicluster_<gbit>gbit`` calibrated with one round's measurements: the
    links' bus bandwidth at the message size nearest to the run's; where the round timed the
    call that the layout makes across nodes in the run's own shape (Horovod's flat call,
    multiworker's rings one per local index and its gRPC flat ring: :data:`CHARGED_CROSS_CALLS`),
    that call's.
    ``host_ns``: a host time per byte by strategy that replaces the preset's for that
    strategy's runs (a what-if)."""
    from tfscale.forecast.machines import ModelFigures, load
    from tfscale.forecast.model import HOST_TRANSPORTS, Link

    base = load(f"minicluster_{gbit:g}gbit")
    preset = base.model(model)
    across, inside = links[gbit], links[0.0]["in_node"]
    message = message_bytes(preset.gradient_bytes, layout)
    # A run that hands Horovod its gradient list is charged Horovod's grouped call,
    # fusion-buffer copies and all, where the round timed it (sets from 2026-12-05 evening on).
    grouped = layout.grouped_call
    one_per_node = across.get("grouped", across) if grouped and layout.local == 1 else across
    inter = Link(_size_row(one_per_node, message)["busbw_GBps"],
                 across["pingpong"]["latency_us"])
    # multiworker's hierarchical runs cross on tfscale's rings, one per local index at once,
    # where the round timed them so (sets from 2026-12-06 on): the model shares the node's
    # link among its rings, so it is charged what they drove across together (and no host
    # figure, below). Its flat runs cross on gRPC's ring over all four ranks, charged that
    # ring timed across the link where the round did (--grpc_across; one ring, its host work
    # in its time). Only the calls in CHARGED_CROSS_CALLS are charged.
    charged = layout.cross_call in CHARGED_CROSS_CALLS
    pair = across.get(layout.cross_call) if charged else None
    # Its hierarchical runs' whole exchange, node phases and rings, timed as a step calls it
    # (sets from 2026-12-07 evening on): charged in place of both, at the gradients' size.
    whole = across.get(layout.whole_call) if layout.whole_call in CHARGED_WHOLE_CALLS else None
    whole_calls = ({(layout.nodes, layout.local):
                    _size_row(whole, preset.gradient_bytes)["busbw_GBps"]} if whole else {})
    if pair:
        inter = Link(_size_row(rings_together(pair), message)["busbw_GBps"], inter.latency_us)
    intra = Link(_size_row(inside, preset.gradient_bytes)["busbw_GBps"],
                 base.intra.latency_us)
    local = layout.local
    figures = ModelFigures(preset.gradient_bytes, batch_size, local, {"fp32": node_rate},
                           preset.backward_fraction, None, "bench.shaped_links")
    # A flat ring's in-node hop, one way: the round's one-node Horovod all-reduce moved each
    # byte both ways on the one core, so a hop runs at twice its bus bandwidth.
    ring = links[0.0].get("in_node_ring")
    hop = 2 * _size_row(ring, preset.gradient_bytes)["busbw_GBps"] if ring else 0.0
    # fp16's casts, where the round timed them on a node (older sets did not: none charged).
    cast_ns = links[0.0].get("cast_ns_per_byte", {}).get(model, 0.0)
    # Horovod's call over the 2x2 flat layout's ranks, where the round timed it (sets from
    # 2026-12-05 on), at the run's message size: what its flat runs are charged (grouped, as
    # above, where the round has that; over Gloo, Gloo's).
    call = next((across[name] for name in layout.flat_call if name in across), None)
    flat = {(2, 2): _size_row(call, message)["busbw_GBps"]} if call else {}
    machine = dataclasses.replace(base, inter=inter, intra=intra, models={model: figures},
                                  ring_hop_GBps=hop, cast_s_per_byte=cast_ns * 1e-9,
                                  flat_call_GBps=flat, hierarchical_call_GBps=whole_calls)
    # The host figures: the round's own measurement of each transport (sets from 2026-11-28
    # on; the plan's strategy picks its own, Strategy.host_transports), else the
    # preset's; a what-if's for the run's strategy replaces them all.
    measured = dict(links[0.0].get("idle_ns_per_byte", {}))
    # gRPC in the flat ring's own topology at the model's size, where the round has it (sets
    # from 2026-11-28 evening on: bench.grpc_ring_host_time), instead of two workers on a core.
    in_topology = links[0.0].get("grpc_ring_ns_per_stack_byte", {}).get(model)
    if measured and in_topology is not None:
        measured["grpc"] = in_topology
    if host_ns and layout.strategy in host_ns:
        measured = dict.fromkeys(HOST_TRANSPORTS, host_ns[layout.strategy])
    if measured:
        machine = dataclasses.replace(
            machine, host_s_per_byte=measured["tcp"] * 1e-9,
            idle_host_s_per_byte=measured["tcp"] * 1e-9,
            transport_idle_s_per_byte={t: measured[t] * 1e-9 for t in HOST_TRANSPORTS[1:]
                                       if t in measured})
    if pair or whole:
        # The call was timed as the run crosses: after the backward pass, both ranks of a
        # node on its one core. Its time holds the host work, so none is added.
        machine = dataclasses.replace(machine, host_s_per_byte=0.0, idle_host_s_per_byte=0.0,
                                      transport_idle_s_per_byte={})
    return machine


def plan_for(machine: Any, model: str, layout: Any, batch_size: int) -> Any:
    """The forecast's plan of one run, its exchange pinned to what the run used: algorithm,
    fp16, and where the strategy has them, Horovod's 128 MiB fusion buffer and tfscale's 5 ms
    cycle across nodes (multiworker has neither: one message after the backward pass,
    ``Plan.fixed``); the strategy's transports (``Strategy.host_transports``)."""
    from tfscale.forecast.predict import Plan

    plan = Plan(machine, model, "fp32", batch_size, layout.local,
                (("algorithm", layout.algorithm), ("fp16", layout.fp16)),
                strategy=layout.strategy)
    horovod = tuple((choice, value) for choice, value in (("fusion_mb", 128.0), ("cycle_ms", 5.0))
                    if choice not in plan.fixed)
    return dataclasses.replace(plan, pinned=plan.pinned + horovod)


def forecast_row(gbit: float, model: str, layout: Any, node_rate: float,
                 links: dict[float, dict[str, Any]], batch_size: int,
                 host_ns: Mapping[str, float] | None = None) -> Any:
    """tfscale.forecast's row for one run, its step split into terms (:func:`plan_for`;
    ``host_ns`` as for :func:`machine_for`)."""
    from tfscale.forecast.predict import forecast

    machine = machine_for(gbit, model, layout, node_rate, links, batch_size, host_ns)
    return forecast(plan_for(machine, model, layout, batch_size), [layout.nodes])[0]


def forecast_rate(gbit: float, model: str, layout: Any, node_rate: float,
                  links: dict[float, dict[str, Any]], batch_size: int,
                  host_ns: Mapping[str, float] | None = None) -> float:
    """tfscale.forecast's images/s for one run (:func:`forecast_row`)."""
    rate: float = forecast_row(gbit, model, layout, node_rate, links, batch_size,
                               host_ns).images_per_sec
    return rate


def rows(result: dict[str, Any], host_ns: Mapping[str, float] | None = None,
         ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(link rows, run rows), means over the rounds (``host_ns`` as for :func:`machine_for`)."""
    from tfscale.forecast.machines import load
    from tfscale.forecast.model import host_bytes
    from tfscale.strategies import STRATEGIES

    layouts = _layouts()
    runs, links = _by_round(result), _links_by_round(result)
    by_key = {(run["round"], run["gbit"], run["model"], run["layout"]): run
              for run in result["runs"]}
    def busbw(name: str, found: list[dict[str, Any]], gbit: float = 0.0) -> dict[str, Any]:
        """A link row: the mean bus bandwidth of the rounds' timings at 64 and 16 MiB, and
        the 64 MiB figure's share of the shaped rate (``gbit``, if shaped)."""
        big = _mean([_size_row(f)["busbw_GBps"] for f in found])
        return {"link": name, "busbw 64 MiB GB/s": big,
                "busbw 16 MiB GB/s": _mean([_size_row(f, 16 * 2**20)["busbw_GBps"]
                                            for f in found]),
                **({"rate GB/s": gbit / 8, "of rate": big / (gbit / 8)} if gbit else {}),
                "rounds": len(found)}

    link_rows = []
    for gbit in sorted({row["gbit"] for row in result["links"] if row["gbit"]}):
        found = [links[r][gbit] for r in links if gbit in links[r]]
        link_rows.append({**busbw(f"{gbit:g} Gbit/s", found, gbit),
                          "latency us": _mean([f["pingpong"]["latency_us"] for f in found])})
        ring_across = [f["ring"] for f in found if "ring" in f]
        pairs = [f["ring_pair"] for f in found if "ring_pair" in f]
        if ring_across:
            charged = "one ring alone" if pairs else "multiworker hierarchical; not charged"
            link_rows.append(busbw(f"{gbit:g} Gbit/s, tfscale's ring ({charged})",
                                   ring_across, gbit))
        wholes = [f["hierarchical_call"] for f in found if "hierarchical_call" in f]
        if pairs:  # what multiworker's hierarchical runs are charged, where not the whole call
            charged = "" if wholes else ", charged"
            link_rows.append(busbw(f"{gbit:g} Gbit/s, tfscale's rings, one per local index at "
                                   "once (2 on each node's core, both rings' bytes; multiworker "
                                   f"hierarchical's cross phase{charged})",
                                   [rings_together(p) for p in pairs], gbit))
        if wholes:
            link_rows.append(busbw(f"{gbit:g} Gbit/s, multiworker's hierarchical exchange over "
                                   "2x2 ranks (node phases and rings as a step calls them; "
                                   "its hierarchical runs' call, charged)", wholes, gbit))
        grouped = [f["grouped"] for f in found if "grouped" in f]
        if grouped:
            link_rows.append(busbw(f"{gbit:g} Gbit/s, Horovod's grouped call (2x1 runs' call: "
                                   "fusion-buffer copies)", grouped, gbit))
        flat_across = [f["flat"] for f in found if "flat" in f]
        flat_grouped = [f["flat_grouped"] for f in found if "flat_grouped" in f]
        if flat_across:
            whose = "one tensor" if flat_grouped else "its flat runs' call"
            link_rows.append(busbw(f"{gbit:g} Gbit/s, Horovod over 2x2 ranks ({whose}; 2 ranks "
                                   "on each node's core)", flat_across, gbit))
        if flat_grouped:
            link_rows.append(busbw(f"{gbit:g} Gbit/s, Horovod's grouped call over 2x2 ranks "
                                   "(flat runs' call: fusion-buffer copies)", flat_grouped, gbit))
        gloo = [f["flat_grouped_gloo"] for f in found if "flat_grouped_gloo" in f]
        if gloo:
            link_rows.append(busbw(f"{gbit:g} Gbit/s, the same over Gloo (horovodrun; flat gloo "
                                   "runs' call)", gloo, gbit))
    inside = [links[r][0.0]["in_node"] for r in links if 0.0 in links[r]]
    if inside:
        link_rows.append(busbw("inside a node (shared memory, 2 ranks on 1 core)", inside))
    ring = [links[r][0.0]["in_node_ring"] for r in links
            if 0.0 in links[r] and "in_node_ring" in links[r][0.0]]
    if ring:
        link_rows.append(busbw("inside a node (Horovod: Open MPI's shared memory, a flat ring's "
                               "in-node hop; 2 ranks on 1 core)", ring))
    run_rows = []
    keys = sorted({(run["gbit"], run["model"], run["layout"]) for run in result["runs"]},
                  key=lambda k: (k[1], k[0], list(layouts).index(k[2])))
    for gbit, model, name in keys:
        layout = layouts[name]
        batch = batch_of(result["models"][model])
        gradient_bytes = load("minicluster_1gbit").model(model).gradient_bytes
        measured, floors, forecasts, effs, per_byte = [], [], [], [], []
        for r in sorted(runs):
            rate = runs[r].get((gbit, model, name))
            one = runs[r].get((0.0, model, "1x1"))
            node = node_rate(by_key.get((r, gbit, model, name), {}), runs[r], model,
                             layout.local)
            if rate is None or one is None or node is None:
                continue
            measured.append(rate)
            if layout.uses_link:
                effs.append(rate / (layout.nodes * node))
                step = layout.local * batch / one + crossing_bytes(
                    gradient_bytes, layout.nodes, layout.local, layout.algorithm,
                    layout.fp16) / (gbit * 1e9 / 8)
                floors.append(layout.nodes * layout.local * batch / step)
                stack = host_bytes(gradient_bytes / (2 if layout.fp16 else 1), layout.algorithm,
                                   layout.local, layout.nodes,
                                   STRATEGIES.get(layout.strategy).ring_hop_transport)
                exchange_s = layout.nodes * layout.local * batch / rate - layout.local * batch / one
                per_byte.append(exchange_s / stack * 1e9)
                if gbit in links[r] and 0.0 in links[r]:
                    forecasts.append(forecast_rate(
                        gbit, model, layout, node,
                        links_of(by_key[r, gbit, model, name], links[r]), batch, host_ns))
        row: dict[str, Any] = {
            "model": model, "link": f"{gbit:g} Gbit/s" if gbit else "none (one node)",
            "run": name, "images/s": _mean(measured),
            "range": f"{min(measured):.4g}-{max(measured):.4g}" if measured else "",
            "rounds": len(measured)}
        if effs:
            row["efficiency"] = _mean(effs)
            # How far each round's efficiency lies from the run's mean: what the VM moves
            # between a baseline and its run, which a forecast from the baseline cannot follow.
            row["round deviations"] = [e / row["efficiency"] - 1 for e in effs]
            row["of floor"] = row["images/s"] / _mean(floors)
            row["ns per stack byte"] = _mean(per_byte)
        if forecasts:
            row["forecast images/s"] = _mean(forecasts)
            row["forecast error"] = f"{_mean(forecasts) / row['images/s'] - 1:+.1%}"
        run_rows.append(row)
    return link_rows, run_rows


def hierarchy_wins(run_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Hierarchical against flat (2x2) per model and link, with and without fp16."""
    index = {(r["model"], r["link"], r["run"]): r["images/s"] for r in run_rows}
    out = []
    for model, link in sorted({(r["model"], r["link"]) for r in run_rows if "Gbit" in r["link"]}):
        row: dict[str, Any] = {"model": model, "link": link}
        for suffix, label in (("", "fp32"), (" fp16", "fp16")):
            flat = index.get((model, link, f"2x2 flat{suffix}"))
            hier = index.get((model, link, f"2x2 hierarchical{suffix}"))
            if flat and hier:
                row[f"hierarchical / flat, {label}"] = hier / flat
        ddl, flat = index.get((model, link, "2x2 ddl")), index.get((model, link, "2x2 flat"))
        if ddl and flat:
            row["ddl / flat, fp32"] = ddl / flat
        flat = index.get((model, link, "2x2 multiworker flat"))
        hier = index.get((model, link, "2x2 multiworker hierarchical"))
        if flat and hier:
            row["multiworker hierarchical / flat"] = hier / flat
        out.append(row)
    return out


#: The groups of a timeline's activities in the report: the wait before each collective,
#: the collectives themselves, and inside them the transport's own operation and the copies
#: through the fusion buffer.
TIMELINE_KINDS = ("negotiation", "collectives", "transport", "copies")
_COLLECTIVES = ("ALLREDUCE", "ALLGATHER", "REDUCESCATTER", "BROADCAST", "ALLTOALL")


def timeline_kind(name: str) -> str:
    """The group of one of Horovod's timeline activities (``TIMELINE_KINDS``), or "" for one
    the report leaves out (ALLOCATE_OUTPUT, ...): ``NEGOTIATE_ALLREDUCE`` is a negotiation,
    ``ALLREDUCE`` (or ddl's ``REDUCESCATTER`` and ``ALLGATHER``) a collective,
    ``MPI_ALLREDUCE`` or ``GLOO_ALLGATHER`` the transport's, ``MEMCPY_IN_FUSION_BUFFER`` a
    copy."""
    if name.startswith("NEGOTIATE_"):
        return "negotiation"
    if name in _COLLECTIVES:
        return "collectives"
    if name.startswith("MEMCPY_"):
        return "copies"
    prefix, _, op = name.partition("_")
    return "transport" if op in _COLLECTIVES and prefix else ""


def forecast_runs(result: dict[str, Any], wanted: Callable[[dict[str, Any]], bool],
                  host_ns: Mapping[str, float] | None = None,
                  ) -> Iterator[tuple[dict[str, Any], float, float, Any]]:
    """(run, its measured step in ms, the one-node step in ms that its forecast is calibrated
    on, the forecast's row for it) for each run across the link that ``wanted`` picks and the
    set can forecast (a one-node rate, and its round's link figures); ``host_ns`` as for
    :func:`machine_for`."""
    layouts = _layouts()
    runs, links = _by_round(result), _links_by_round(result)
    for run in result["runs"]:
        r, gbit, model = run["round"], run["gbit"], run["model"]
        if not gbit or not wanted(run):
            continue
        layout = layouts[run["layout"]]
        batch = batch_of(result["models"][model])
        node = node_rate(run, runs[r], model, layout.local)
        if node is None or gbit not in links[r] or 0.0 not in links[r]:
            continue
        step = layout.nodes * layout.local * batch / rate_of(run) * 1e3
        yield run, step, layout.local * batch / node * 1e3, forecast_row(
            gbit, model, layout, node, links_of(run, links[r]), batch, host_ns)


def timeline_rows(result: dict[str, Any], host_ns: Mapping[str, float] | None = None,
                  ) -> list[dict[str, Any]]:
    """One row per round of each run that kept Horovod's timeline (``--horovod_timelines``),
    in milliseconds per step: the measured step and the forecast's, the exchange the step
    waited for (measured: the step less the forecast's compute and stragglers, the part the
    forecast calibrates on the run's baseline; forecast: its exposed exchange), the forecast's
    whole exchange (overlapped or not), and rank 0's timeline by :func:`timeline_kind`:
    negotiation (waiting for every rank to enqueue and for the cycle), the collectives, and
    within them the transport's own (MPI_ALLREDUCE, ...) and the copies in and out of the
    fusion buffer. An activity's ms per step is its share of the timeline's wall time times
    the measured step."""
    out = []
    for run, step, _, row in forecast_runs(result, lambda run: bool(run.get("timeline")),
                                           host_ns):
        model, gbit, r = run["model"], run["gbit"], run["round"]
        per_step: dict[str, float] = dict.fromkeys(TIMELINE_KINDS, 0.0)
        for activity in run["timeline"]:
            kind = timeline_kind(activity["name"])
            if kind:
                per_step[kind] += activity["share"] * step
        out.append({"model": model, "link": f"{gbit:g} Gbit/s", "run": run["layout"],
                    "round": r, "step": step, "forecast step": row.step_ms,
                    "waited": step - row.terms_ms["compute"] - row.terms_ms["stragglers"],
                    "forecast waited": row.exchange_ms, "forecast whole": row.exchange_busy_ms,
                    **per_step})
    return sorted(out, key=lambda row: (row["model"], row["link"], row["run"], row["round"]))


TIMELINE_COLUMNS = ["model", "link", "run", "round", "step", "forecast step", "waited",
                    "forecast waited", "forecast whole", *TIMELINE_KINDS]


def step_split_rows(result: dict[str, Any], host_ns: Mapping[str, float] | None = None,
                    ) -> list[dict[str, Any]]:
    """One row per round of each two-node run whose progress lines timed its exchange (sets
    from 2026-12-06 afternoon on: ``steady_exchange_share``, rank 0's), in milliseconds per
    step: the measured step split by that clock into the exchange the steps waited for and the
    rest, each beside the forecast's (its exposed exchange; its compute and stragglers, the
    compute being the run's one-node baseline step less the forecast's own exchange of that
    node), and each part's error: a forecast error shows as the exchange's or the rest's.

    A rank that finishes its backward pass before the slowest rank of another node waits for
    it inside its exchange, so the clock holds that wait, which the forecast counts in its
    rest (its stragglers, and its compute where the baseline's slowest rank set it). Where the
    run's baseline kept its clock (``baseline_exchange_share``, sets from 2026-12-07 on), or
    else the round's one-node run with the run's ranks per node, the row also gives the node's
    rest (the baseline's step less the exchange share of that clock: the node's compute, no
    node to wait for), and reads the clock against the forecast's exchange plus what its rest
    holds beyond the node's (``exchange + wait error``), and the run's rest against the node's
    (``rest against node``: below 0, the run computed slower than its baseline)."""
    out = []
    node_share = {(run["round"], run["model"], run["layout"]):
                  run.get("steady_exchange_share") or 0.0  # one process exchanges nothing
                  for run in result["runs"] if not run["gbit"]}
    layouts = _layouts()
    for run, step, node_step, row in forecast_runs(
            result, lambda run: run.get("steady_exchange_share") is not None, host_ns):
        model, gbit, r, share = run["model"], run["gbit"], run["round"], \
            run["steady_exchange_share"]
        exchange, rest = share * step, (1 - share) * step
        forecast_rest = row.terms_ms["compute"] + row.terms_ms["stragglers"]
        local = layouts[run["layout"]].local
        shared = run.get("baseline_exchange_share")
        if shared is None:
            shared = node_share.get((r, model, f"1x{local}"))
        wait: dict[str, Any] = {}
        if shared is not None and (local == 1 or shared > 0):
            node_rest = node_step * (1 - shared)
            waited = row.exchange_ms + forecast_rest - node_rest
            wait = {"node rest": node_rest,
                    "exchange + wait error": f"{waited / exchange - 1:+.1%}",
                    "rest against node": f"{node_rest / rest - 1:+.1%}"}
        out.append({"model": model, "link": f"{gbit:g} Gbit/s", "run": run["layout"],
                    "round": r, "step": step, "forecast step": row.step_ms,
                    "exchange": exchange, "forecast exchange": row.exchange_ms,
                    "exchange error": f"{row.exchange_ms / exchange - 1:+.1%}",
                    "rest": rest, "forecast rest": forecast_rest,
                    "rest error": f"{forecast_rest / rest - 1:+.1%}", **wait})
    return sorted(out, key=lambda row: (row["model"], row["link"], row["run"], row["round"]))


STEP_SPLIT_COLUMNS = ["model", "link", "run", "round", "step", "forecast step", "exchange",
                      "forecast exchange", "exchange error", "rest", "forecast rest",
                      "rest error", "node rest", "exchange + wait error", "rest against node"]


def grpc_timing_lines(link_rows: list[dict[str, Any]]) -> list[str]:
    """One line per round that timed gRPC's flat ring: each model's timings in the order
    taken (ns per stack byte) and the figure the round charged (their median; sets before
    2026-12-04 took one timing at each end and charged the mean)."""
    lines = []
    for row in link_rows:
        timings = row.get("grpc_ring_timings") or {}
        charged = row.get("grpc_ring_ns_per_stack_byte") or {}
        if timings:
            models = "; ".join(
                f"{model} {', '.join(f'{t:.2f}' for t in values)}, charged {charged[model]:.2f}"
                for model, values in sorted(timings.items()))
            lines.append(f"gRPC's flat ring, round {row['round']} (ns per stack byte): {models}.")
    return [*lines, ""] if lines else []


def grpc_link_lines(link_rows: list[dict[str, Any]]) -> list[str]:
    """One line per round and link that timed gRPC's flat ring across the link (``"grpc_flat"``,
    ``--grpc_across``): each model's timings in the order taken (ms per all-reduce) and the
    median's bus bandwidth, whether multiworker's 2x2 flat runs are charged it or not
    (:data:`CHARGED_CROSS_CALLS`)."""
    charged = ("charged to multiworker flat" if "grpc_flat" in CHARGED_CROSS_CALLS else
               "multiworker flat's call; not charged")
    lines = []
    for row in link_rows:
        timed = row.get("grpc_flat")
        if timed:
            models = "; ".join(
                f"{size['model']} "
                f"{', '.join(f'{1e3 * t:.0f}' for t in timed['timings_s'][size['model']])}, "
                f"median {1e3 * size['seconds_per_call']:.0f} ({size['busbw_GBps']:.3f} GB/s)"
                for size in timed["sizes"])
            lines.append(f"gRPC's flat ring across {row['gbit']:g} Gbit/s, round {row['round']} "
                         f"(ms per all-reduce, 2 ranks on each node's core; {charged}): "
                         f"{models}.")
    return [*lines, ""] if lines else []


def _ms_table(header: str, rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    """A report section of per-step rows, milliseconds to 0.1 (nothing without rows)."""
    if not rows:
        return []
    return [header, "", table([{k: f"{v:.1f}" if isinstance(v, float) else v
                                for k, v in row.items()} for row in rows], columns), ""]


def report(result: dict[str, Any], host_ns: Mapping[str, float] | None = None) -> str:
    """The tables of ``result``; ``host_ns`` as for :func:`machine_for`, named in the count."""
    link_rows, run_rows = rows(result, host_ns)
    forecast = [r for r in run_rows if "forecast error" in r]

    def miss(row: dict[str, Any]) -> float:
        return abs(float(row["forecast error"].rstrip("%")))

    within = sum(miss(r) <= 10 for r in forecast)
    deviations = [d for r in run_rows if len(r.get("round deviations", [])) > 1
                  for d in r["round deviations"]]
    spread = ([f"The same run's efficiency from round to round (each against its "
               f"baseline): {sum(abs(d) > 0.10 for d in deviations)} of {len(deviations)} "
               f"rounds more than 10% from their run's mean, up to "
               f"{max(abs(d) for d in deviations):.1%}.", ""] if deviations else [])
    drifts = [d for d in map(bracket_drift, result["runs"]) if d is not None]
    if drifts:
        spread += [f"The baseline after a run against the one before it "
                   f"(--bracketed_baselines): {sum(abs(d) > 0.05 for d in drifts)} of "
                   f"{len(drifts)} runs more than 5% apart, median "
                   f"{statistics.median(drifts):+.1%}, from {min(drifts):+.1%} to "
                   f"{max(drifts):+.1%}.", ""]
    spread += grpc_timing_lines(result["links"]) + grpc_link_lines(result["links"])
    spread += _ms_table(
        "Horovod's timeline on rank 0 against the forecast (ms per step; waited: the step less "
        "the forecast's compute and stragglers; whole: the forecast's exchange, overlapped or "
        "not; negotiation, the collectives and within them the transport and the copies: the "
        "timeline's):", timeline_rows(result, host_ns), TIMELINE_COLUMNS)
    spread += _ms_table(
        "Each run's step split by tfscale's exchange clock (rank 0's progress lines) against "
        "the forecast's terms (ms per step; exchange: what the steps waited for their "
        "gradients; rest: the step less that, against the forecast's compute and stragglers; "
        "an error above 0: the forecast's part is the longer; node rest: the one-node "
        "baseline's step less its own clock's exchange; exchange + wait: the forecast's "
        "exchange and its rest beyond the node's, which a rank waits for inside its exchange, "
        "against the clock; rest against node: the node's rest against the run's):",
        step_split_rows(result, host_ns), STEP_SPLIT_COLUMNS)
    missing = [f"No timeline from {run['model']} {run['layout']}, round {run['round']}: "
               f"{run['timeline_error']}" for run in result["runs"] if "timeline_error" in run]
    spread += [*missing, ""] if missing else []
    worst = max(forecast, key=miss, default=None)
    worst_text = (f"; worst {worst['forecast error']} ({worst['model']}, {worst['link']}, "
                  f"{worst['run']})" if worst else "")
    return "\n".join([
        f"{result.get('cpu', '')}; {result.get('when', '')}; {result['rounds']} round(s)"
        + (" (partial)" if result.get("partial") else ""),
        "", "Links between the nodes (tc tbf per direction; bus bandwidth of Horovod's MPI "
        "all-reduce, one rank per node, or of tfscale's ring where named; latency: half a TCP "
        "ping-pong):", "",
        table(link_rows, ["link", "rate GB/s", "busbw 64 MiB GB/s", "busbw 16 MiB GB/s",
                          "of rate", "latency us", "rounds"]),
        "", "Runs (images/s: mean over rounds; efficiency: against 2 x the 1-node run with the "
        "same ranks per node):", "",
        table(run_rows, ["model", "link", "run", "images/s", "range", "rounds", "efficiency",
                         "of floor", "ns per stack byte", "forecast images/s",
                         "forecast error"]),
        "", "Hierarchy against one flat ring (2x2, images/s ratio):", "",
        table(hierarchy_wins(run_rows), ["model", "link", "hierarchical / flat, fp32",
                                         "hierarchical / flat, fp16", "ddl / flat, fp32",
                                         "multiworker hierarchical / flat"]),
        "", *spread,
        f"Forecast within 10% of the measured images/s: {within} of {len(forecast)} runs"
        + worst_text + "".join(f"; {strategy}'s runs charged {ns:g} ns of host time per byte"
                               for strategy, ns in sorted((host_ns or {}).items())),
    ])
