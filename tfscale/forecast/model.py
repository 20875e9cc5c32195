"""The performance model: what one data-parallel training step costs at N nodes.

Step time = compute + exposed exchange. The exchange is a gradient all-reduce, costed with the
alpha-beta model (a fixed latency per message step plus bytes over bandwidth):

- ring all-reduce over p ranks: ``2(p-1) * latency + 2(p-1)/p * bytes / bandwidth`` (a
  reduce-scatter then an all-gather, each ``p-1`` steps of ``bytes/p``);
- flat: one ring over every rank of every node; each of its ``2(p-1)`` steps waits for its
  slowest hop, so the inter-node link sets both the latency and the bandwidth;
- hierarchical (DDL, Horovod's hierarchical all-reduce): reduce-scatter inside the node,
  all-reduce of each rank's ``1/L`` shard across nodes (the ``L`` ranks of a node share its
  network), all-gather inside the node: fewer latency steps, more bytes over in-node links.

Horovod's background thread wakes every cycle time, negotiates which gradients are ready (a
small tree all-reduce over all ranks) and all-reduces them in messages of at most the fusion
buffer. Gradients become ready evenly over the backward pass; messages go one after the other.
What runs past the end of the backward pass is exposed; the rest overlaps it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import statistics
from collections.abc import Callable, Sequence

ALGORITHMS = ("flat", "hierarchical")
FUSION_MB_CHOICES = (16.0, 32.0, 64.0, 128.0, 256.0)
CYCLE_MS_CHOICES = (1.0, 2.5, 5.0, 10.0, 25.0)
_MB = 1024 * 1024


@dataclasses.dataclass(frozen=True)
class Link:
    """A link's bandwidth per direction (GB/s, 1e9 bytes) and latency per message step (us)."""

    bandwidth_GBps: float
    latency_us: float

    def transfer_s(self, nbytes: float, steps: int) -> float:
        """Seconds for ``steps`` latencies plus ``nbytes`` at the link's bandwidth."""
        return steps * self.latency_us * 1e-6 + nbytes / (self.bandwidth_GBps * 1e9)


def ring_allreduce_s(nbytes: float, ranks: int, link: Link) -> float:
    """Ring all-reduce of ``nbytes`` over ``ranks`` ranks: ``2(p-1)`` steps of ``nbytes/p``."""
    if ranks <= 1:
        return 0.0
    return link.transfer_s(2 * (ranks - 1) / ranks * nbytes, 2 * (ranks - 1))


def reduce_scatter_s(nbytes: float, ranks: int, link: Link) -> float:
    """Ring reduce-scatter (or all-gather, the same cost): ``p-1`` steps of ``nbytes/p``."""
    if ranks <= 1:
        return 0.0
    return link.transfer_s((ranks - 1) / ranks * nbytes, ranks - 1)


def flat_allreduce_s(nbytes: float, local: int, nodes: int, intra: Link, inter: Link) -> float:
    """One ring over all ``local * nodes`` ranks; across nodes every step waits for the slowest
    hop (the ring crosses each node boundary once, so one message uses a node's network)."""
    if nodes <= 1:
        return ring_allreduce_s(nbytes, local, intra)
    slowest = Link(min(intra.bandwidth_GBps, inter.bandwidth_GBps),
                   max(intra.latency_us, inter.latency_us))
    return ring_allreduce_s(nbytes, local * nodes, slowest)


def hierarchical_allreduce_s(nbytes: float, local: int, nodes: int, intra: Link,
                             inter: Link, across_scale: float = 1.0) -> float:
    """Reduce-scatter in the node, all-reduce of each ``1/local`` shard across nodes (the node's
    ``local`` rings share its network), all-gather in the node. ``across_scale`` scales the
    bytes of the ring across nodes only (0.5: fp16 compression of that phase, the in-node
    phases staying float32, as tfscale's shared-memory node phases do)."""
    across = Link(inter.bandwidth_GBps / local, inter.latency_us)
    return (2 * reduce_scatter_s(nbytes, local, intra)
            + ring_allreduce_s(nbytes * across_scale / local, nodes, across))


# How the hops of a flat ring between two ranks of one node travel: "shared_memory" (Open MPI's
# shared-memory transport, NCCL over NVLink or PCIe: no network stack) or "tcp" (Gloo and
# TensorFlow's gRPC ring: loopback TCP, host time on the node like a hop across nodes).
TRANSPORTS = ("shared_memory", "tcp")


# Whose host work per byte an exchange across nodes does (tfscale.forecast.machines' figures;
# each strategy's class names its own: Strategy.host_transports): raw TCP (MPI, and what
# --calibrate's host figures time), tfscale's ring and TensorFlow's gRPC collective.
HOST_TRANSPORTS = ("tcp", "ring", "grpc")
# The flat ring in which gRPC's host figure is timed (python -m tfscale.cli.host_time grpc N
# --flat_ring, which --calibrate runs): nodes of ranks that share one core each.
FLAT_RING_NODES, FLAT_RING_LOCAL = 2, 2


def host_bytes(nbytes: float, algorithm: str, local: int, nodes: int,
               transport: str = "shared_memory") -> float:
    """Bytes one node's ranks put through the network stack for one all-reduce of ``nbytes``.

    On a flat ring over ``p = local x nodes`` ranks every rank sends ``2(p-1)/p`` of it. The
    ring, ranks in node order, leaves each node once: over ``"tcp"`` all ``local`` of the node's
    ranks send through the stack (its in-node hops are loopback TCP), over ``"shared_memory"``
    only the one whose next rank is on the next node. Hierarchical, each rank's ring across the
    nodes carries ``2(N-1)/N`` of its ``1/local`` shard (the in-node phases go through the
    in-node link). 0 on one node."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport={transport!r}; expected one of {', '.join(TRANSPORTS)}")
    if nodes <= 1:
        return 0.0
    if algorithm == "flat":
        ranks = local * nodes
        senders = local if transport == "tcp" else 1
        return senders * 2 * (ranks - 1) / ranks * nbytes
    return 2 * (nodes - 1) / nodes * nbytes


def straggler_factor(ranks: int, measured_ranks: int, step_cv: float) -> float:
    """How much longer a synchronous step is at ``ranks`` ranks than the measured one at
    ``measured_ranks``, when each rank's step time varies with coefficient of variation
    ``step_cv``: the step waits for the slowest rank, and the expected largest of n normal
    samples is ``mean + sd x E[max of n standard normals]`` (Blom's approximation of that
    order statistic, ``Phi^-1((n - 0.375) / (n + 0.25))``; the maximum's distribution tends to
    a Gumbel law, so the expected wait grows like ``sqrt(2 ln n)``)."""
    return (1 + step_cv * expected_max(ranks)) / (1 + step_cv * expected_max(measured_ranks))


def expected_max(n: int) -> float:
    """Expected largest of ``n`` standard normal samples (Blom 1958); 0 for one sample."""
    return 0.0 if n <= 1 else statistics.NormalDist().inv_cdf((n - 0.375) / (n + 0.25))


def negotiation_s(ranks: int, inter: Link) -> float:
    """One cycle's negotiation: a tree all-reduce of a small bit vector over all ranks."""
    return 0.0 if ranks <= 1 else 2 * math.ceil(math.log2(ranks)) * inter.latency_us * 1e-6


@dataclasses.dataclass(frozen=True)
class Exchange:
    """How gradients are exchanged: algorithm, fp16 compression, fusion buffer, cycle time."""

    algorithm: str = "flat"
    fp16: bool = False
    fusion_mb: float = 64.0
    cycle_ms: float = 5.0

    def describe(self) -> str:
        """``flat, fp16, fusion 64 MB, cycle 5 ms``; with an unbounded fusion buffer (a
        strategy that all-reduces the gradients at once), ``flat, one message``."""
        knobs = ("one message" if math.isinf(self.fusion_mb)
                 else f"fusion {self.fusion_mb:g} MB, cycle {self.cycle_ms:g} ms")
        return f"{self.algorithm}{', fp16' if self.fp16 else ''}, {knobs}"

    def allreduce(self, local: int, nodes: int, intra: Link, inter: Link,
                  host_s_per_byte: float = 0.0, transport: str = "shared_memory",
                  ring_hop_GBps: float = 0.0, cast_s_per_byte: float = 0.0,
                  ranks_per_core: float = 1.0,
                  call_GBps: float = 0.0) -> Callable[[float], float]:
        """Seconds to all-reduce one fused message of ``nbytes`` (before compression).

        ``host_s_per_byte`` > 0 where a node's ranks share a core that also computes: the
        links were measured with one rank per node and its core otherwise idle, so there the
        message takes the longer of its alpha-beta time and the host-bound time (the host time
        of every byte the node's ranks put through the network stack, :func:`host_bytes` over
        ``transport``, at ``host_s_per_byte``, plus the message steps' latency; hierarchical,
        plus the in-node phases), and then, flat over ``"shared_memory"``, the ring's
        ``local - 1`` in-node hops of each node, one way each, which take their turn on the
        same core, at ``ring_hop_GBps`` (the flat ring's own in-node transport, e.g. Open MPI's
        shared memory between two ranks on one core; default: ``intra``'s bandwidth).

        fp16 compression halves a flat ring's bytes, and only the ring across nodes of the
        hierarchical exchange (tfscale's node phases stay float32 in shared memory).
        With fp16 compression and ``cast_s_per_byte`` > 0, each rank also casts what it sends
        to float16 and the result back, on its core, before and after the message: the whole
        message on a flat ring, its ``1/local`` shard for the hierarchical exchange (tfscale's
        node phases stay float32; only the ring across nodes is float16; none on one node;
        none for one rank, which exchanges nothing),
        ``ranks_per_core`` ranks' casts one after the other where ranks share a core.

        ``call_GBps`` > 0: the bus bandwidth of the exchange's own call, for its algorithm, over
        exactly these ``local x nodes`` ranks, timed across the link at the message's size
        (:attr:`tfscale.forecast.machines.Machine.flat_call_GBps` and ``hierarchical_call_GBps``).
        A flat call holds what a ring over the links does not: the algorithm the collective
        library picks (Open MPI 4.1 takes Rabenseifner's for large messages, whose steps
        across nodes carry a node's share, not a ring's), its in-node steps, and their turns on
        a shared core. A hierarchical call (float32 only; nodes > 1) holds its three phases as
        a step runs them, one after the other on the node's cores, and what joins them (the
        rings' host calls, the copies in and out of TensorFlow's memory). A message then takes
        ``2(p-1)/p`` of its bytes at that rate instead of the phases' or a ring's alpha-beta
        time and in-node hops; the host-bound floor stays."""
        flat = self.algorithm == "flat"
        scale = 0.5 if self.fp16 else 1.0

        measured = (call_GBps > 0 and local * nodes > 1
                    and (flat or (nodes > 1 and not self.fp16)))

        def algorithm(nbytes: float, local: int, nodes: int, intra: Link, inter: Link) -> float:
            if flat:
                return flat_allreduce_s(nbytes * scale, local, nodes, intra, inter)
            return hierarchical_allreduce_s(nbytes, local, nodes, intra, inter, scale)

        # The host-bound part: the hierarchical exchange's in-node phases run before and after
        # its ring across nodes, so they add to that ring's host time, not hide behind it. A
        # flat ring's hops run at once on separate cores, but where a node's ranks share one
        # core, its in-node hops and its hop across take turns on it. Over tcp, host_bytes
        # already counts the in-node hops (they go through the stack).
        host_links = (Link(math.inf, intra.latency_us) if flat else intra,
                      Link(math.inf, inter.latency_us))
        hop_Bps = (ring_hop_GBps or intra.bandwidth_GBps) * 1e9
        in_node_hops = flat and transport == "shared_memory" and nodes > 1 and not measured
        casts = 0.0
        if self.fp16 and local * nodes > 1 and (flat or nodes > 1):
            casts = cast_s_per_byte * ranks_per_core / (1 if flat else local)

        def seconds(nbytes: float) -> float:
            sent = nbytes * scale
            wire = (ring_allreduce_s(sent, local * nodes, Link(call_GBps, 0.0)) if measured
                    else algorithm(nbytes, local, nodes, intra, inter))
            if not host_s_per_byte:
                return wire + casts * nbytes
            host = (algorithm(nbytes, local, nodes, *host_links)
                    + host_s_per_byte * host_bytes(sent, self.algorithm, local, nodes, transport))
            hops = 0.0
            if in_node_hops:  # the core's turn at them, after its hop across, alpha-beta or host
                ranks = local * nodes
                hops = (local - 1) * 2 * (ranks - 1) / ranks * sent / hop_Bps
            return max(wire, host) + hops + casts * nbytes

        return seconds


@dataclasses.dataclass(frozen=True)
class Overlap:
    """The exchange of one step laid over its backward pass."""

    exposed_s: float  # past the end of the backward pass
    busy_s: float  # the exchange's own time, negotiation included
    messages: int


def overlap_exchange(gradient_bytes: float, backward_s: float, exchange: Exchange,
                     allreduce: Callable[[float], float], negotiate_s: float = 0.0,
                     overlap: bool = True, phase: float = 0.0) -> Overlap:
    """Lays the step's all-reduces over its backward pass, cycle by cycle.

    Args:
        gradient_bytes: bytes of gradients per step (fp32, before compression).
        backward_s: the backward pass's duration; gradients become ready evenly over it, or all
            at its end when ``overlap`` is False (a worker whose exchange shares its cores).
        exchange: fusion buffer and cycle time; a cycle of 0 (a strategy without Horovod's
            background thread, e.g. multiworker) all-reduces every gradient, in messages of at
            most the fusion buffer (unbounded: one), when the backward pass ends, with no
            negotiation.
        allreduce: seconds to all-reduce one message of N bytes.
        negotiate_s: fixed cost of each cycle that sends something.
        overlap: whether the exchange can run during the backward pass.
        phase: where in its cycle the background thread is when the backward pass starts, as a
            fraction of a cycle (0: the first cycle ends one cycle in).

    Returns:
        What is exposed after the backward pass, and the exchange's busy time.
    """
    if gradient_bytes <= 0 or allreduce(gradient_bytes) <= 0:
        return Overlap(0.0, 0.0, 0)
    if not exchange.cycle_ms:  # no cycle: everything at once when the backward pass ends
        fusion = exchange.fusion_mb * _MB
        full = 0 if math.isinf(fusion) else int(gradient_bytes // fusion)
        rest = gradient_bytes - full * fusion if full else gradient_bytes  # no 0 x inf
        sizes = [fusion] * full + ([rest] if rest > 1e-12 * gradient_bytes else [])
        busy = sum(allreduce(size) for size in sizes)
        return Overlap(busy, busy, len(sizes))
    cycle = exchange.cycle_ms * 1e-3
    fusion = exchange.fusion_mb * _MB
    free = sent = busy = 0.0
    messages = 0
    tick = 0
    while sent < gradient_bytes * (1 - 1e-12):
        tick += 1
        now = (tick - phase) * cycle
        if overlap and backward_s > 0:
            ready = gradient_bytes * min(now / backward_s, 1.0)
        else:
            ready = gradient_bytes if now >= backward_s else 0.0
        pending = ready - sent
        if pending <= 0:
            continue
        start = max(now, free) + negotiate_s
        busy += negotiate_s
        while pending > 0:
            chunk = min(pending, fusion)
            cost = allreduce(chunk)
            start += cost
            busy += cost
            pending -= chunk
            sent += chunk
            messages += 1
        free = start
    return Overlap(max(0.0, free - backward_s), busy, messages)


def candidates(algorithm: str | None = None, fp16: bool | None = None,
               fusion_mb: float | None = None,
               cycle_ms: float | None = None) -> list[Exchange]:
    """Every exchange the recommendation compares; a given value pins that choice."""
    return [Exchange(a, f, b, c) for a, f, b, c in itertools.product(
        [algorithm] if algorithm else ALGORITHMS,
        [fp16] if fp16 is not None else (False, True),
        [fusion_mb] if fusion_mb else FUSION_MB_CHOICES,
        [cycle_ms] if cycle_ms is not None else CYCLE_MS_CHOICES)]


def best_exchange(step_of: Callable[[Exchange], float],
                  options: Sequence[Exchange]) -> tuple[Exchange, float]:
    """The option with the shortest step. fp16 compression changes the gradients, so it is
    recommended only when it saves more than 1% of the step over the best exact option."""
    steps = {option: step_of(option) for option in options}
    exact = [o for o in options if not o.fp16] or list(options)
    best = min(exact, key=lambda o: steps[o])
    compressed = min(options, key=lambda o: steps[o])
    if steps[compressed] < 0.99 * steps[best]:
        best = compressed
    return best, steps[best]
