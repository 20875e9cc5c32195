"""Machine files: a cluster's nodes, links and measured compute, each number with its source.

A machine is a JSON file (presets ship in ``tfscale/forecast/machines/``)::

    {"name": "summit", "description": "...",
     "node": {"ranks": 6, "source": "..."},
     "intra_node": {"bandwidth_GBps": 32, "latency_us": 1, "source": "..."},
     "inter_node": {"bandwidth_GBps": 25, "latency_us": 1, "source": "..."},
     "exchange": {"overlap": true, "source": "..."},
     "stragglers": {"step_cv": 0.01, "source": "..."},
     "models": {"resnet50": {"gradient_bytes": 102228128, "batch_size": 256,
                             "measured_ranks": 6, "images_per_sec": {"mixed_float16": 5320},
                             "backward_fraction": 0.667, "pipeline_images_per_sec": null,
                             "source": "..."}}}

Bandwidths are per direction in GB/s (1e9 bytes); ``inter_node`` is what one node can send
into the network. ``images_per_sec`` is the throughput of ``measured_ranks`` ranks of one node
at ``batch_size`` per rank, exchange included; the model takes its own forecast of that node's
exchange out of it to get the compute time. ``pipeline_images_per_sec`` (per rank, optional)
caps a step at what the input pipeline delivers.

Optional terms, each with its source (docs/FORECAST.md, "The model"): a link's
``software_latency_us`` (the collective library's own time per message step, added to the
wire's ``latency_us``); ``exchange.host_ns_per_byte``, the host time per byte of the exchange
on a core that also computes (``--calibrate`` measures it; used where a node's ranks outnumber
its ``node.cores``), and ``exchange.idle_ns_per_byte``, the same on a core otherwise idle (used
instead where ``exchange.overlap`` is false: the exchange runs after the backward pass);
``exchange.idle_ns_per_byte_by_transport``, the idle figure of multiworker's own transports
(``{"ring": ..., "grpc": ...}``: tfscale's ring across nodes, TensorFlow's gRPC collective for
its flat ring; ``--calibrate`` measures them with :mod:`tfscale.cli.host_time`), charged
instead of raw TCP's ``idle_ns_per_byte`` to a multiworker plan's exchange;
``exchange.cast_ns_per_byte``, the time per float32 byte of casting gradients to float16 and
back for ``--fp16_allreduce`` on the node's cores (``--calibrate`` measures it; not given:
free, as on GPUs, where the casts run at memory bandwidth);
``intra_node.ring_hop_GBps``, the rate of one hop of a flat ring between two ranks of a node
that share its core, through the ring's own transport, when it is not ``intra_node``'s;
``stragglers.step_cv``, the spread of one rank's step time (sd / mean) that a synchronous
step pays as the expected slowest of its ranks; ``inter_node.flat_calls``, the flat
exchange's own all-reduce timed across the network in one shape (``[{"nodes": 2,
"ranks_per_node": 2, "busbw_GBps": 0.115, "source": "..."}]``, nccl-tests' bus bandwidth of
one call over all those ranks), charged instead of a ring's time to flat plans of exactly that
shape whose strategy's in-node hops go through the library's shared memory (Horovod over MPI);
``inter_node.hierarchical_calls``, the same for multiworker's hierarchical exchange's whole
call (its node phases and tfscale's rings across, as a step runs them), charged instead of its
phases' times to float32 hierarchical plans of exactly that shape whose strategy crosses on
tfscale's rings (multiworker). :mod:`tfscale.cli.link_time`, run on the nodes, writes both.
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any, NoReturn

from tfscale.config.train_config import PRECISIONS
from tfscale.forecast import files
from tfscale.forecast.model import HOST_TRANSPORTS, Link

PRESET_DIR = Path(__file__).with_name("machines")


@dataclasses.dataclass(frozen=True)
class ModelFigures:
    """What a machine measured (or a paper published) for one model."""

    gradient_bytes: float
    batch_size: int
    measured_ranks: int
    images_per_sec: dict[str, float]
    backward_fraction: float
    pipeline_images_per_sec: float | None
    source: str


@dataclasses.dataclass(frozen=True)
class Machine:
    """A validated machine file."""

    name: str
    description: str
    path: Path
    ranks_per_node: int
    intra: Link
    inter: Link
    overlap: bool
    models: dict[str, ModelFigures]
    raw: dict[str, Any]
    host_s_per_byte: float = 0.0  # the exchange's host time per byte on a busy core
    cores_per_node: int = 0  # cores the node's ranks share (0: one core per rank at least)
    step_cv: float = 0.0  # spread of a rank's step time (sd / mean): stragglers
    idle_host_s_per_byte: float = 0.0  # the same with the core otherwise idle (0: not given)
    ring_hop_GBps: float = 0.0  # a flat ring's in-node hop between ranks sharing a core
    cast_s_per_byte: float = 0.0  # fp16 compression's casts down and up, per float32 byte
    # Idle figures of transports other than raw TCP ("ring", "grpc"), where measured.
    transport_idle_s_per_byte: dict[str, float] = dataclasses.field(default_factory=dict)
    # The flat exchange's own call timed across the link, bus bandwidth by (nodes, ranks per
    # node): charged to flat plans of exactly that shape (model.Exchange.allreduce).
    flat_call_GBps: dict[tuple[int, int], float] = dataclasses.field(default_factory=dict)
    # The same for multiworker's hierarchical exchange's whole call (its three phases as a
    # step runs them): charged to float32 hierarchical plans of exactly that shape that cross
    # on tfscale's rings.
    hierarchical_call_GBps: dict[tuple[int, int], float] = dataclasses.field(
        default_factory=dict)

    def host_rate(self, transport: str = "tcp", after_backward: bool = False) -> float:
        """Host seconds per byte of an exchange through ``transport`` (:data:`HOST_TRANSPORTS`)
        where a node's ranks share its cores: the idle core's figure when the exchange runs
        after the backward pass (``overlap`` false, or ``after_backward``: a strategy whose
        exchange starts when the backward pass ends; nothing computes beside it) and the file
        gives it (the transport's own where it has one, else raw TCP's), else the busy core's
        (measured over raw TCP only)."""
        if (after_backward or not self.overlap) and self.idle_host_s_per_byte:
            return self.transport_idle_s_per_byte.get(transport, self.idle_host_s_per_byte)
        return self.host_s_per_byte

    def model(self, model: str) -> ModelFigures:
        """The figures the file holds for ``model``.

        Raises:
            ValueError: naming the file and the models it has.
        """
        if model not in self.models:
            raise ValueError(f"{self.path}: machine {self.name!r} has no figures for model "
                             f"{model!r}; it has: {', '.join(sorted(self.models)) or 'none'} "
                             f"(add them with --calibrate)")
        return self.models[model]

    def figures(self, model: str, precision: str) -> tuple[ModelFigures, float]:
        """The model's figures and its node throughput at ``precision``.

        Raises:
            ValueError: naming the file and what it has instead.
        """
        figures = self.model(model)
        if precision not in figures.images_per_sec:
            raise ValueError(f"{self.path}: machine {self.name!r} has no compute rate for "
                             f"--precision={precision} of model {model!r}; it has: "
                             f"{', '.join(sorted(figures.images_per_sec))}")
        return figures, figures.images_per_sec[precision]


def presets() -> list[str]:
    """The names of the shipped machine files."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.json"))


def resolve(name_or_path: str) -> Path:
    """A preset's file, or the path given.

    Raises:
        ValueError: when it is neither, listing the presets.
    """
    return files.resolve("machine", name_or_path, PRESET_DIR, kind="machine preset")


def load(name_or_path: str) -> Machine:
    """Reads and validates a machine file (a preset's name or a path).

    Raises:
        ValueError: naming the file and the bad field.
    """
    path = resolve(name_or_path)
    return parse(files.read("machine", path), path)


def parse(raw: Any, path: Path) -> Machine:
    """Validates a machine document read from ``path``.

    Raises:
        ValueError: naming the file and the bad field.
    """
    check = _Checker(path)
    doc = check.section(raw, "", ("name", "node", "intra_node", "inter_node", "models"))
    node = check.section(doc["node"], "node", ("ranks", "source"))
    exchange = doc.get("exchange", {"overlap": True, "source": "not given: overlap assumed"})
    check.section(exchange, "exchange", ("overlap", "source"))
    if not isinstance(exchange["overlap"], bool):
        check.fail("exchange.overlap", "must be true or false", exchange["overlap"])
    models = check.section(doc["models"], "models", ())
    host_ns = (check.number(exchange, "exchange", "host_ns_per_byte", low_inclusive=True)
               if "host_ns_per_byte" in exchange else 0.0)
    idle_ns = (check.number(exchange, "exchange", "idle_ns_per_byte", low_inclusive=True)
               if "idle_ns_per_byte" in exchange else 0.0)
    cast_ns = (check.number(exchange, "exchange", "cast_ns_per_byte", low_inclusive=True)
               if "cast_ns_per_byte" in exchange else 0.0)
    by_transport = check.section(exchange.get("idle_ns_per_byte_by_transport", {}),
                                 "exchange.idle_ns_per_byte_by_transport", ())
    for name in by_transport:
        if name not in HOST_TRANSPORTS[1:]:
            check.fail(f"exchange.idle_ns_per_byte_by_transport.{name}",
                       f"is not a transport; expected {' or '.join(HOST_TRANSPORTS[1:])} (raw "
                       "TCP's is exchange.idle_ns_per_byte)")
    transport_ns = {name: check.number(by_transport, "exchange.idle_ns_per_byte_by_transport",
                                       name, low_inclusive=True) for name in by_transport}
    ring_hop = (check.number(doc["intra_node"], "intra_node", "ring_hop_GBps")
                if isinstance(doc["intra_node"], dict) and "ring_hop_GBps" in doc["intra_node"]
                else 0.0)
    flat_calls = check.calls(doc["inter_node"], "flat_calls")
    hierarchical_calls = check.calls(doc["inter_node"], "hierarchical_calls")
    stragglers = doc.get("stragglers", {"step_cv": 0.0, "source": "not given: none"})
    check.section(stragglers, "stragglers", ("step_cv", "source"))
    return Machine(
        name=check.text(doc, "", "name"), description=str(doc.get("description", "")),
        path=path, ranks_per_node=check.count(node, "node", "ranks"),
        intra=check.link(doc["intra_node"], "intra_node"),
        inter=check.link(doc["inter_node"], "inter_node"),
        overlap=exchange["overlap"],
        models={name: check.model(entry, f"models.{name}") for name, entry in models.items()},
        raw=doc, host_s_per_byte=host_ns * 1e-9,
        cores_per_node=check.count(node, "node", "cores") if "cores" in node else 0,
        step_cv=check.number(stragglers, "stragglers", "step_cv", low_inclusive=True,
                             high=1.0),
        idle_host_s_per_byte=idle_ns * 1e-9, ring_hop_GBps=ring_hop,
        cast_s_per_byte=cast_ns * 1e-9,
        transport_idle_s_per_byte={name: ns * 1e-9 for name, ns in transport_ns.items()},
        flat_call_GBps=flat_calls, hierarchical_call_GBps=hierarchical_calls)


class _Checker:
    """Field checks whose errors name the file and the field's dotted path."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, field: str, problem: str, value: Any = ...) -> NoReturn:
        got = "" if value is ... else f", got {value!r}"
        raise ValueError(f"{self.path}: field '{field}' {problem}{got}")

    def section(self, value: Any, where: str, required: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(where or "(top level)", "must be a JSON object", value)
        for key in required:
            if key not in value:
                self.fail(f"{where}.{key}" if where else key, "is missing")
        return value

    def text(self, doc: dict[str, Any], where: str, key: str) -> str:
        value = doc[key]
        if not isinstance(value, str) or not value.strip():
            self.fail(f"{where}.{key}" if where else key, "must be a non-empty string", value)
        return value

    def number(self, doc: dict[str, Any], where: str, key: str, *, low: float = 0.0,
               high: float = math.inf, low_inclusive: bool = False) -> float:
        if key not in doc:
            self.fail(f"{where}.{key}", "is missing")
        value = doc[key]
        ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(
            value) and (value >= low if low_inclusive else value > low) and value <= high
        if not ok:
            bound = ">=" if low_inclusive else ">"
            self.fail(f"{where}.{key}", f"must be a number {bound} {low:g}"
                      + (f" and <= {high:g}" if high < math.inf else ""), value)
        return float(value)

    def count(self, doc: dict[str, Any], where: str, key: str) -> int:
        value = doc.get(key)
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            self.fail(f"{where}.{key}", "must be a whole number >= 1", value)
        return int(value)

    def link(self, doc: Any, where: str) -> Link:
        doc = self.section(doc, where, ("bandwidth_GBps", "latency_us", "source"))
        self.text(doc, where, "source")
        software = (self.number(doc, where, "software_latency_us", low_inclusive=True)
                    if "software_latency_us" in doc else 0.0)
        return Link(self.number(doc, where, "bandwidth_GBps"),
                    self.number(doc, where, "latency_us", low_inclusive=True) + software)

    def calls(self, inter: Any, key: str) -> dict[tuple[int, int], float]:
        """``inter_node.<key>`` (``flat_calls``, ``hierarchical_calls``): bus bandwidth by
        (nodes, ranks per node); {} if absent."""
        if not isinstance(inter, dict) or key not in inter:
            return {}
        entries = inter[key]
        if not isinstance(entries, list):
            self.fail(f"inter_node.{key}", "must be a list of objects", entries)
        found: dict[tuple[int, int], float] = {}
        for i, entry in enumerate(entries):
            where = f"inter_node.{key}[{i}]"
            entry = self.section(entry, where, ("nodes", "ranks_per_node", "busbw_GBps",
                                                "source"))
            self.text(entry, where, "source")
            shape = (self.count(entry, where, "nodes"), self.count(entry, where, "ranks_per_node"))
            if shape[0] < 2:
                self.fail(f"{where}.nodes", "must be >= 2 (a call across the network)",
                          shape[0])
            if shape in found:
                self.fail(where, f"repeats the shape {shape[0]} nodes x {shape[1]} ranks")
            found[shape] = self.number(entry, where, "busbw_GBps")
        return found

    def model(self, doc: Any, where: str) -> ModelFigures:
        doc = self.section(doc, where, ("gradient_bytes", "batch_size", "images_per_sec",
                                        "source"))
        rates = self.section(doc["images_per_sec"], f"{where}.images_per_sec", ())
        if not rates:
            self.fail(f"{where}.images_per_sec", "must name at least one precision")
        for precision in rates:
            if precision not in PRECISIONS or precision == "auto":
                self.fail(f"{where}.images_per_sec", f"has unknown precision {precision!r}; "
                          f"use {', '.join(p for p in PRECISIONS if p != 'auto')}")
            self.number(rates, f"{where}.images_per_sec", precision)
        pipeline = doc.get("pipeline_images_per_sec")
        return ModelFigures(
            gradient_bytes=self.number(doc, where, "gradient_bytes", low_inclusive=True),
            batch_size=self.count(doc, where, "batch_size"),
            measured_ranks=self.count(doc, where, "measured_ranks")
            if "measured_ranks" in doc else 1,
            images_per_sec={k: float(v) for k, v in rates.items()},
            backward_fraction=self.number(doc, where, "backward_fraction", high=1.0)
            if "backward_fraction" in doc else 2 / 3,
            pipeline_images_per_sec=None if pipeline is None
            else self.number(doc, where, "pipeline_images_per_sec"),
            source=self.text(doc, where, "source"))
