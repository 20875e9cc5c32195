"""Forecast rows: step time, images/s, efficiency and the recommended exchange per node count."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from tfscale.forecast.machines import Machine
from tfscale.forecast.model import (
    ALGORITHMS,
    HOST_TRANSPORTS,
    TRANSPORTS,
    Exchange,
    Link,
    best_exchange,
    candidates,
    negotiation_s,
    overlap_exchange,
    straggler_factor,
)
from tfscale.strategies import MULTI_PROCESS_DEFAULT, STRATEGIES

if TYPE_CHECKING:
    from tfscale.forecast.efficiency import EpochsCurve

TERMS = ("compute", "bandwidth", "latency", "host time", "stragglers")


@dataclasses.dataclass(frozen=True)
class Plan:
    """What is forecast: a model at a batch per rank and precision on a machine."""

    machine: Machine
    model: str
    precision: str
    batch_size: int
    ranks_per_node: int = 0  # 0: the machine's
    pinned: tuple[tuple[str, Any], ...] = ()  # exchange choices fixed by the user
    transport: str = ""  # a flat ring's in-node hops ("": the strategy's; model.TRANSPORTS)
    strategy: str = MULTI_PROCESS_DEFAULT  # whose transports carry the exchange (registered)

    @property
    def local(self) -> int:
        return self.ranks_per_node or self.machine.ranks_per_node

    @property
    def ring_transport(self) -> str:
        """How the plan's flat ring crosses between two ranks of a node: the plan's
        ``transport``, else its strategy's."""
        return self.transport or _strategy(self.strategy).ring_hop_transport

    def host_transport(self, algorithm: str) -> str:
        """Whose host figure the plan's exchange across nodes with ``algorithm`` is charged
        (:data:`HOST_TRANSPORTS`): its strategy's."""
        return _strategy(self.strategy).host_transports[algorithm]

    @property
    def fixed(self) -> dict[str, Any]:
        """The exchange choices the plan's strategy does not offer, at what it does instead: a
        strategy without a fusion buffer and cycle (its flags do not include
        ``fusion_threshold_mb``, ``cycle_time_ms``: multiworker) all-reduces the step's
        gradients in one message after the backward pass; without ``fp16_allreduce``, in
        float32."""
        flags = _strategy(self.strategy).flags()
        return {choice: value for choice, (flag, value) in _STRATEGY_CHOICES.items()
                if flag not in flags}


# The exchange choices a strategy may offer: the config field that sets each, and what a
# strategy without it does (one float32 message of all the gradients, as soon as they are all
# ready: no cycle, model.overlap_exchange).
_STRATEGY_CHOICES = {"fp16": ("fp16_allreduce", False),
                     "fusion_mb": ("fusion_threshold_mb", math.inf),
                     "cycle_ms": ("cycle_time_ms", 0.0)}


def _strategy(name: str) -> Any:
    """The registered strategy class of ``name``, its forecast transports checked.

    Raises:
        ValueError: for an unknown strategy (listing the registered ones), or one whose class
            names a transport the model does not know.
    """
    cls = STRATEGIES.get(name)
    unknown = sorted(set(cls.host_transports.values()) - set(HOST_TRANSPORTS)
                     | {cls.ring_hop_transport} - set(TRANSPORTS))
    if unknown or set(cls.host_transports) != set(ALGORITHMS):
        raise ValueError(f"strategy {name!r}: host_transports={cls.host_transports!r}, "
                         f"ring_hop_transport={cls.ring_hop_transport!r}; expected a transport "
                         f"of {', '.join(HOST_TRANSPORTS)} for each of {', '.join(ALGORITHMS)}, "
                         f"and one of {', '.join(TRANSPORTS)}")
    return cls


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
    terms_ms: dict[str, float] = dataclasses.field(default_factory=dict)  # by TERMS

    @property
    def dominant(self) -> str:
        """The term that takes most of the step (compute, bandwidth, latency, host time,
        stragglers)."""
        return max(self.terms_ms, key=lambda t: self.terms_ms[t]) if self.terms_ms else ""

    @property
    def largest_loss(self) -> str:
        """The largest term other than compute, with its share of the step ("" if none)."""
        losses = {t: ms for t, ms in self.terms_ms.items() if t != "compute" and ms > 0}
        if not losses:
            return ""
        term = max(losses, key=lambda t: losses[t])
        return f"{term} {100 * losses[term] / self.step_ms:.1f}%"

    def describe_terms(self) -> str:
        """``compute; stragglers 1.6%`` (compute dominates; the largest loss), or
        ``host time 56%`` when a loss dominates."""
        if self.dominant == "compute" or not self.dominant:
            return "; ".join(t for t in (self.dominant, self.largest_loss) if t)
        return f"{self.dominant} {100 * self.terms_ms[self.dominant] / self.step_ms:.0f}%"

    def as_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["recommended"] = self.recommended.describe()
        out["recommended_exchange"] = dataclasses.asdict(self.recommended)
        out["dominant"] = self.dominant
        return out


# Horovod's cycle is not tied to the step: its phase against the backward pass is averaged.
PHASES = (0.0, 0.25, 0.5, 0.75)


@dataclasses.dataclass(frozen=True)
class _Step:
    """One step's seconds, averaged over the cycle's phases."""

    step: float
    exposed: float
    busy: float
    messages: float
    stragglers: float


def _allreduce(plan: Plan, option: Exchange, local: int, nodes: int,
               intra: Link | None = None, inter: Link | None = None,
               host: bool = True) -> Callable[[float], float]:
    m = plan.machine
    sharing = ranks_per_core(m, local)
    # Without a cycle (multiworker) the exchange starts when the backward pass ends
    # (model.overlap_exchange): nothing computes beside it, on any machine.
    host_s = (m.host_rate(plan.host_transport(option.algorithm), after_backward=not option.cycle_ms)
              if host and sharing > 1 else 0.0)
    # The exchange's own call timed in this very shape, where the machine has it (a flat one
    # where the in-node hops are the library's); it scales with the inter-node link that the
    # terms' split (_terms_ms) varies.
    if option.algorithm == "flat":
        call = (m.flat_call_GBps.get((nodes, local), 0.0)
                if plan.ring_transport == "shared_memory" else 0.0)
    else:  # the whole call timed is multiworker's: tfscale's rings across (tfscale.cli.link_time)
        call = (m.hierarchical_call_GBps.get((nodes, local), 0.0)
                if plan.host_transport("hierarchical") == "ring" else 0.0)
    if inter and call:
        call *= inter.bandwidth_GBps / m.inter.bandwidth_GBps
    return option.allreduce(local, nodes, intra or m.intra, inter or m.inter, host_s,
                            plan.ring_transport, m.ring_hop_GBps,
                            m.cast_s_per_byte if host else 0.0, sharing, call)


def ranks_per_core(machine: Machine, ranks: int) -> float:
    """How many of a node's ``ranks`` take turns on each core: ``ranks / node.cores`` where
    they outnumber its cores, else 1 (each its own, or ``node.cores`` not given)."""
    cores = machine.cores_per_node
    return ranks / cores if cores and ranks > cores else 1.0


def _step(plan: Plan, nodes: int, local: int, compute_s: float, option: Exchange) -> _Step:
    m = plan.machine
    figures, _ = m.figures(plan.model, plan.precision)
    allreduce = _allreduce(plan, option, local, nodes)
    negotiate = negotiation_s(local * nodes, m.inter)
    runs = [overlap_exchange(figures.gradient_bytes, figures.backward_fraction * compute_s,
                             option, allreduce, negotiate, m.overlap, phase)
            for phase in PHASES]
    exposed = sum(r.exposed_s for r in runs) / len(runs)
    busy = sum(r.busy_s for r in runs) / len(runs)
    # The step waits for the slowest rank's gradients: its compute is the expected largest.
    stragglers = compute_s * (straggler_factor(local * nodes, figures.measured_ranks,
                                               m.step_cv) - 1)
    step = compute_s + stragglers + exposed
    if figures.pipeline_images_per_sec:
        step = max(step, plan.batch_size / figures.pipeline_images_per_sec)
    return _Step(step, exposed, busy, sum(r.messages for r in runs) / len(runs), stragglers)


def _step_s(plan: Plan, nodes: int, local: int, compute_s: float, option: Exchange
            ) -> tuple[float, float, float]:
    """(step, exposed exchange, busy exchange) seconds of one step, averaged over phases."""
    s = _step(plan, nodes, local, compute_s, option)
    return s.step, s.exposed, s.busy


def _terms_ms(plan: Plan, nodes: int, local: int, compute_s: float, option: Exchange,
              step: _Step) -> dict[str, float]:
    """The step split into TERMS: the exposed exchange shared out among latency, bandwidth and
    host time as they share an average message's cost."""
    figures, _ = plan.machine.figures(plan.model, plan.precision)
    size = figures.gradient_bytes / max(step.messages, 1.0)
    m = plan.machine
    whole = _allreduce(plan, option, local, nodes)(size)
    latency = _allreduce(plan, option, local, nodes, Link(1e12, m.intra.latency_us),
                         Link(1e12, m.inter.latency_us), host=False)(size)
    bandwidth = _allreduce(plan, option, local, nodes, Link(m.intra.bandwidth_GBps, 0.0),
                           Link(m.inter.bandwidth_GBps, 0.0), host=False)(size)
    host = max(whole - latency - bandwidth, 0.0)
    total = latency + bandwidth + host
    share = (lambda part: step.exposed * part / total) if total > 0 else (lambda part: 0.0)
    return {"compute": compute_s * 1e3, "bandwidth": share(bandwidth) * 1e3,
            "latency": share(latency) * 1e3, "host time": share(host) * 1e3,
            "stragglers": step.stragglers * 1e3}


def compute_s_per_image(plan: Plan) -> float:
    """A rank's compute seconds per image: the measured node step less the model's own forecast
    of that node's exposed exchange. The exposure depends on the compute (the backward pass it
    hides behind), so the compute is the largest whose forecast step fits the measured one
    (bisection; the step grows with the compute)."""
    figures, node_rate = plan.machine.figures(plan.model, plan.precision)
    measured = figures.batch_size * figures.measured_ranks / node_rate
    sub = dataclasses.replace(plan, batch_size=figures.batch_size)

    # The measured node exchanged float32 gradients (a machine file's rate is a plain run's;
    # the mini-cluster's one-node runs use no compression), whatever the plan pins for the
    # forecast rows: the compute is calibrated against that exchange.
    measured_options = list(dict.fromkeys(dataclasses.replace(o, fp16=False)
                                          for o in _options(plan)))

    def step(compute: float) -> float:
        return best_exchange(
            lambda option: _step_s(sub, 1, figures.measured_ranks, compute, option)[0],
            measured_options)[1]

    low, high = 0.5 * measured, measured
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if step(middle) <= measured else (low, middle)
    return low / figures.batch_size


def _options(plan: Plan) -> list[Exchange]:
    """The exchanges the plan compares: its pins, its strategy's fixed choices, the rest
    searched.

    Raises:
        ValueError: for a pin that the strategy does not offer, naming both.
    """
    fixed = plan.fixed
    for choice, value in plan.pinned:
        if choice in fixed and value != fixed[choice]:
            raise ValueError(f"{choice}={value!r} is not a choice under --strategy="
                             f"{plan.strategy}, which has no --{_STRATEGY_CHOICES[choice][0]}: "
                             f"it uses {choice}={fixed[choice]!r}")
    return candidates(**{**dict(plan.pinned), **fixed})


def forecast(plan: Plan, node_counts: Sequence[int]) -> list[Row]:
    """The forecast at each node count, with its best exchange; efficiency is relative to one
    node of the same machine, as published scaling tables count it.

    Raises:
        ValueError: for a plan's strategy or transport the model does not know.
    """
    _strategy(plan.strategy)
    if plan.ring_transport not in TRANSPORTS:
        raise ValueError(f"transport={plan.transport!r}; expected one of {', '.join(TRANSPORTS)}")
    figures, _ = plan.machine.figures(plan.model, plan.precision)
    local = plan.local
    # Ranks that take turns on a core each compute that much slower than the measured ones.
    sharing = (ranks_per_core(plan.machine, local)
               / ranks_per_core(plan.machine, figures.measured_ranks))
    compute = compute_s_per_image(plan) * plan.batch_size * sharing
    rows = []
    one_node = None
    for nodes in sorted(set(node_counts) | {1}):
        def step_of(option: Exchange, n: int = nodes) -> float:
            return _step_s(plan, n, local, compute, option)[0]

        best, step = best_exchange(step_of, _options(plan))
        chosen = _step(plan, nodes, local, compute, best)
        rate = nodes * local * plan.batch_size / step
        one_node = one_node or rate
        rows.append(Row(nodes, nodes * local, nodes * local * plan.batch_size, compute * 1e3,
                        chosen.exposed * 1e3, chosen.busy * 1e3, step * 1e3, rate,
                        rate / (nodes * one_node), best,
                        _terms_ms(plan, nodes, local, compute, best, chosen)))
    return [r for r in rows if r.nodes in set(node_counts)]


def fastest(rows: Sequence[Row], curve: EpochsCurve) -> Row | None:
    """The row with the fewest minutes to the curve's target (None where no row's global batch
    was measured): past its node count, more nodes no longer shorten the run."""
    known = [(minutes, r) for r in rows
             if (minutes := curve.minutes(r.global_batch, r.images_per_sec)) is not None]
    return min(known, key=lambda pair: pair[0])[1] if known else None


def compare_measured(plan: Plan, nodes: int, measured_images_per_sec: float) -> dict[str, Any]:
    """Forecast against a measured run (for the mini-cluster's shaped links): the relative error
    of the forecast images/s, positive when the forecast is higher."""
    row = forecast(plan, [nodes])[0]
    return {"nodes": nodes, "forecast_images_per_sec": row.images_per_sec,
            "measured_images_per_sec": measured_images_per_sec,
            "error": row.images_per_sec / measured_images_per_sec - 1.0,
            "recommended": row.recommended.describe()}
