"""Forecast rows: step time, images/s, efficiency and the recommended exchange per node count."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from tfscale.forecast.machines import Machine
from tfscale.forecast.model import (
    Exchange,
    best_exchange,
    candidates,
    negotiation_s,
    overlap_exchange,
)


@dataclasses.dataclass(frozen=True)
class Plan:
    """What is forecast: a model at a batch per rank and precision on a machine."""

    machine: Machine
    model: str
    precision: str
    batch_size: int
    ranks_per_node: int = 0  # 0: the machine's
    pinned: tuple[tuple[str, Any], ...] = ()  # exchange choices fixed by the user

    @property
    def local(self) -> int:
        return self.ranks_per_node or self.machine.ranks_per_node


@dataclasses.dataclass(frozen=True)
class Row:
    """One node count's forecast."""

    nodes: int
    ranks: int
    global_batch: int
    compute_ms: float
    exchange_ms: float  # exposed: what the step waits for after its backward pass
    exchange_busy_ms: float  # the whole exchange, overlapped or not
    step_ms: float
    images_per_sec: float
    efficiency: float
    recommended: Exchange

    def as_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["recommended"] = self.recommended.describe()
        out["recommended_exchange"] = dataclasses.asdict(self.recommended)
        return out


# Horovod's cycle is not tied to the step: its phase against the backward pass is averaged.
PHASES = (0.0, 0.25, 0.5, 0.75)


def _step_s(plan: Plan, nodes: int, local: int, compute_s: float, option: Exchange
            ) -> tuple[float, float, float]:
    """(step, exposed exchange, busy exchange) seconds of one step, averaged over phases."""
    m = plan.machine
    figures, _ = m.figures(plan.model, plan.precision)
    allreduce = option.allreduce(local, nodes, m.intra, m.inter)
    negotiate = negotiation_s(local * nodes, m.inter)
    runs = [overlap_exchange(figures.gradient_bytes, figures.backward_fraction * compute_s,
                             option, allreduce, negotiate, m.overlap, phase)
            for phase in PHASES]
    exposed = sum(r.exposed_s for r in runs) / len(runs)
    busy = sum(r.busy_s for r in runs) / len(runs)
    step = compute_s + exposed
    if figures.pipeline_images_per_sec:
        step = max(step, plan.batch_size / figures.pipeline_images_per_sec)
    return step, exposed, busy


def compute_s_per_image(plan: Plan) -> float:
    """A rank's compute seconds per image: the measured node step less the model's own forecast
    of that node's exposed exchange. The exposure depends on the compute (the backward pass it
    hides behind), so the compute is the largest whose forecast step fits the measured one
    (bisection; the step grows with the compute)."""
    figures, node_rate = plan.machine.figures(plan.model, plan.precision)
    measured = figures.batch_size * figures.measured_ranks / node_rate
    sub = dataclasses.replace(plan, batch_size=figures.batch_size)

    def step(compute: float) -> float:
        return best_exchange(
            lambda option: _step_s(sub, 1, figures.measured_ranks, compute, option)[0],
            _options(plan))[1]

    low, high = 0.5 * measured, measured
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if step(middle) <= measured else (low, middle)
    return low / figures.batch_size


def _options(plan: Plan) -> list[Exchange]:
    return candidates(**dict(plan.pinned))


def forecast(plan: Plan, node_counts: Sequence[int]) -> list[Row]:
    """The forecast at each node count, with its best exchange; efficiency is relative to one
    node of the same machine, as published scaling tables count it."""
    per_image = compute_s_per_image(plan)
    compute = per_image * plan.batch_size
    local = plan.local
    rows = []
    one_node = None
    for nodes in sorted(set(node_counts) | {1}):
        def step_of(option: Exchange, n: int = nodes) -> float:
            return _step_s(plan, n, local, compute, option)[0]

        best, step = best_exchange(step_of, _options(plan))
        _, exposed, busy = _step_s(plan, nodes, local, compute, best)
        rate = nodes * local * plan.batch_size / step
        one_node = one_node or rate
        rows.append(Row(nodes, nodes * local, nodes * local * plan.batch_size, compute * 1e3,
                        exposed * 1e3, busy * 1e3, step * 1e3, rate, rate / (nodes * one_node),
                        best))
    return [r for r in rows if r.nodes in set(node_counts)]


def compare_measured(plan: Plan, nodes: int, measured_images_per_sec: float) -> dict[str, Any]:
    """Forecast against a measured run (for the mini-cluster's shaped links): the relative error
    of the forecast images/s, positive when the forecast is higher."""
    row = forecast(plan, [nodes])[0]
    return {"nodes": nodes, "forecast_images_per_sec": row.images_per_sec,
            "measured_images_per_sec": measured_images_per_sec,
            "error": row.images_per_sec / measured_images_per_sec - 1.0,
            "recommended": row.recommended.describe()}
