"""Scaling across shaped links: the two-node mini-cluster with its links between nodes limited
by ``tc`` (token bucket, per direction), and the forecast of every run.

For each link speed, in alternating rounds:

- the all-reduce bus bandwidth between the nodes (Horovod over MPI, one rank per node;
  nccl-tests' definition), the same over the 2x2 flat layout's four ranks (since 2026-12-05:
  charged to the flat runs, whose call it is), both also as Horovod's grouped call of several
  tensors (since 2026-12-05 evening: charged to the 2x1 and 2x2 flat runs, which hand Horovod
  their gradient list and pay its fusion-buffer copies), with a ``2x2 flat gloo`` run in the set
  the flat grouped call over Gloo too (charged to it), tfscale's ring alone and, since
  2026-12-06, its rings one per local index at once (charged to multiworker's hierarchical
  runs, whose phase across nodes they are), and the link's latency (TCP ping-pong);
- ``mlp`` and ``resnet50`` (64 px) weak scaling: 1x1 and 1x2 (one node, no link), 2x1, and
  2x2 flat (one Horovod all-reduce over the 4 ranks, ``--node_exchange=collectives``), 2x2
  hierarchical (shared memory inside each node, Horovod across; with ``--strategy=horovod``
  and ``--strategy=ddl``), horovod's flat and hierarchical also with ``--fp16_allreduce``,
  horovod's flat also over Gloo (``2x2 flat gloo``: ``horovodrun --gloo`` instead of srun), and
  ``--strategy=multiworker`` flat (TensorFlow's gRPC ring) and hierarchical (shared memory
  inside each node, tfscale's TCP ring across; TensorFlow's gRPC collective before 95850aa).

Each run is set against the floor its link sets (compute + bytes crossing the link / the
shaped rate) and against ``tfscale.forecast``, whose machine is calibrated on the round's own
1-node runs and link measurements only (never on a 2-node run).

multiworker's flat runs, where their set did not time their call across the link (below),
are charged Open MPI's link figure and gRPC's host figure timed in their own topology
(``python -m tfscale.cli.host_time grpc N --flat_ring``), twice at each round's start and twice
at its end, the median of the four (since 2026-12-04; from 2026-11-28 night once at each end,
the mean of the two; the set before once, at the start). One 3-second timing ran 3x slow on
the Zen 3 and alone set a run's forecast 30% off (docs/FORECAST.md, 2026-12-04). With
``--grpc_across`` (since 2026-12-07 the default where a set runs that layout) each link's row
also times that ring across the shaped link, three times per model
(``bench.grpc_link_time.link_row``): the runs' own call, wire and host work in one timing.
Since 2026-12-07 the flat runs of a set that timed it are charged it in place of Open MPI's
link figure and gRPC's host figure: on a Zen 4 that older charge set them 10-15% too
slow at 1 Gbit/s, and over a Zen 3's and a Zen 4's rounds the call keeps 15 of 16 within 10%
(docs/FORECAST.md, "gRPC's flat ring charged as timed across").

Every node has one core of this machine (launch.minicluster), so the 2 ranks of a node share
it. The kernel here has no ``netem``: latency is the path's own, measured, not added.

Since 2026-11-28 a run's images/s is taken after its first progress interval (mlp: steps
201-1000, resnet50: 5-24), and each one-node run runs on both nodes at once, two separate
jobs, whose mean is the baseline: the nodes share this machine's cache and memory, which a
two-node run keeps busy on both. Sets measured before (200 mlp steps, 8 resnet50 steps, the
other node idle) keep their figures.

With ``--adjacent_baselines`` (sets from 2026-11-29 on) each two-node run gets its own one-node
baseline, run just before it, and its forecast is calibrated on that: this VM's speed moved by a
quarter within half an hour with nothing changed (bench.shaped_link_pairs). Since 2026-12-07
that baseline runs under the run's own strategy where its one-node step differs from horovod's
(``OWN_ONE_NODE``: multiworker's 1x2; the run keeps its name, ``baseline_layout``); the
round's one-node runs stay horovod's. With
``--adjacent_figures`` each also gets the figures its forecast takes timed just before it (its
link, in-node exchange, casts, host time per byte), not at the round's start; on the EPYC one
such 3-second timing swung more than the drift it was to follow (docs/FORECAST.md, 2026-11-29
morning), so the round's figures remain the better input (``--report --round_figures``). On
the Xeon the VM slowed by up to a third within one round, more than the round's figures could
follow (the same document, 2026-11-29, later). With ``--bracketed_baselines`` each two-node run
also gets the same baseline just after it (shared with the next run where it has the same model
and one-node run), and is calibrated on the mean of the two: one 1-minute baseline that
landed in a slow minute made a forecast miss by 25% (the Zen 4's three rounds, 2026-12-02).
With ``--horovod_timelines`` each Horovod run across nodes (horovod, ddl) also writes Horovod's
timeline, and the set keeps rank 0's summed per activity (tfscale.exchange.horovod_timeline);
the report sets it per step beside the forecast's exchange. Since 2026-12-06 afternoon each
run also keeps the share of its step that tfscale's clock in the step found waiting for the
exchange (rank 0's progress lines, ``exchange NN%``; :mod:`tfscale.exchange.timing`), and the
report splits every run's step by it into the exchange and the rest, each beside the
forecast's: a miss shows as the exchange's or the compute's.

    python -m bench.shaped_links [--rounds 2 --links 1,10,25 --adjacent_baselines
                                  --bracketed_baselines --adjacent_figures
                                  --horovod_timelines]   (as root)
    python -m bench.shaped_links --report [--result FILE]         (tables from the last run)
    [--round_figures]  (each run from its round's figures, not those timed beside it)
    [--before_only]    (each run from its baseline before it only, not the mean around it)
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from bench.common import OUT, ROOT, cpu_description, in_round_order, save
from bench.transport_host_time import idle_figures
from tfscale.cli import link_time
from tfscale.cli.output import ends_quietly
from tfscale.exchange.horovod_timeline import TIMELINE_FILE, load, summarize
from tfscale.forecast.calibrate import progress_windows

CLUSTER = [sys.executable, "-m", "launch.minicluster"]
NODES = ("node1", "node2")
PORT = 47011
MODELS = {
    "mlp": ["--model=mlp", "--image_size=32", "--batch_size=64", "--steps=1000",
            "--log_every=200"],
    "resnet50": ["--model=resnet50", "--image_size=64", "--batch_size=16", "--steps=24",
                 "--log_every=4"],
}


@dataclasses.dataclass(frozen=True)
class Layout:
    """One run's shape: nodes x ranks per node, strategy and exchange flags."""

    name: str
    nodes: int
    local: int
    strategy: str = "horovod"
    flags: tuple[str, ...] = ()
    algorithm: str = "flat"  # the forecast's name for its exchange
    #: Horovod's transport: "mpi" (srun, Open MPI) or "gloo" (horovodrun --gloo, two nodes)
    transport: str = "mpi"

    @property
    def fp16(self) -> bool:
        return "--fp16_allreduce" in self.flags

    @property
    def uses_link(self) -> bool:
        return self.nodes > 1

    @property
    def grouped_call(self) -> bool:
        """Whether its runs hand Horovod their gradient list (horovod without tfscale's node
        phases: 2x1 and flat), whose call :func:`link_figures` times as ``"grouped"`` and
        ``"flat_grouped"``; the hierarchical layouts hand it one buffer."""
        return self.strategy == "horovod" and self.algorithm == "flat"

    @property
    def flat_call(self) -> tuple[str, ...]:
        """The link rows' timings of the call over the 2x2 ranks that this layout's runs are
        charged, the first one a round has (older sets lack the grouped one): Gloo's own
        (``"flat_grouped_gloo"``, :func:`gloo_call_figures`) over Gloo, else Horovod's grouped
        call where the runs hand Horovod their gradient list, else the one-tensor call."""
        if self.transport == "gloo":
            return ("flat_grouped_gloo",)
        return ("flat_grouped", "flat") if self.grouped_call else ("flat",)

    @property
    def cross_call(self) -> str:
        """The link rows' timing of the call that this layout's runs make across nodes, where
        it is not Horovod's: multiworker's hierarchical runs cross on tfscale's rings, one per
        local index, all at once (``"ring_pair"``), its 2x2 flat runs on TensorFlow's gRPC ring
        over the four ranks (``"grpc_flat"``, :func:`measure` with ``grpc_across``); "" for
        the others. Where the round timed it (it is in
        ``bench.shaped_links_report.CHARGED_CROSS_CALLS``), its runs are charged it instead
        of Open MPI's all-reduce with one rank per node and a host figure."""
        from tfscale.forecast.model import FLAT_RING_LOCAL, FLAT_RING_NODES

        if self.strategy != "multiworker":
            return ""
        if self.algorithm == "hierarchical" and self.local > 1:
            return "ring_pair"
        flat_ring = (self.nodes, self.local) == (FLAT_RING_NODES, FLAT_RING_LOCAL)
        return "grpc_flat" if self.algorithm == "flat" and flat_ring else ""

    @property
    def whole_call(self) -> str:
        """The link rows' timing of this layout's whole exchange as its step calls it, where
        the round times one (``"hierarchical_call"``: multiworker's hierarchical exchange,
        node phases and rings, over the 2x2 ranks, :func:`link_figures`); "" for the others.
        Where the round timed it (``bench.shaped_links_report.CHARGED_WHOLE_CALLS``), its
        runs are charged it instead of the node phases' figure and the rings'."""
        hierarchical = self.algorithm == "hierarchical" and self.local > 1
        return "hierarchical_call" if self.strategy == "multiworker" and hierarchical else ""

    @property
    def has_timeline(self) -> bool:
        """Whether ``--horovod_timeline`` applies: a Horovod exchange across nodes."""
        return self.uses_link and self.strategy in ("horovod", "ddl")


# The one-node runs are the forecast's compute figure for a node whose ranks each apply the
# whole update, as they do in every two-node run: a one-node job's SGD momentum update is
# sharded over its processes by default (--sharded_update, since 2026-12-02), which a job on
# several nodes never is, so the 1x2 runs leave it off.
ONE_NODE = (Layout("1x1", 1, 1),
            Layout("1x2", 1, 2, flags=("--node_exchange=shared_memory", "--sharded_update=false"),
                   algorithm="hierarchical"))
ACROSS = (
    Layout("2x1", 2, 1),
    Layout("2x2 flat", 2, 2, flags=("--node_exchange=collectives",)),
    # The same run over Gloo, whose waits block where Open MPI's poll on the shared cores
    # (docs/FORECAST.md, "Open MPI's polling, not the step"); charged Gloo's own call.
    Layout("2x2 flat gloo", 2, 2, flags=("--node_exchange=collectives",), transport="gloo"),
    Layout("2x2 flat fp16", 2, 2, flags=("--node_exchange=collectives", "--fp16_allreduce")),
    Layout("2x2 hierarchical", 2, 2, flags=("--node_exchange=shared_memory",),
           algorithm="hierarchical"),
    Layout("2x2 hierarchical fp16", 2, 2,
           flags=("--node_exchange=shared_memory", "--fp16_allreduce"), algorithm="hierarchical"),
    # ddl's --node_exchange=auto takes shared memory, but Horovod's collectives where its
    # timeline is on (so that it records something): named, the run is the same with or without.
    Layout("2x2 ddl", 2, 2, strategy="ddl", flags=("--node_exchange=shared_memory",),
           algorithm="hierarchical"),
    Layout("2x2 multiworker flat", 2, 2, strategy="multiworker",
           flags=("--node_exchange=collectives",)),
    Layout("2x2 multiworker hierarchical", 2, 2, strategy="multiworker",
           flags=("--node_exchange=shared_memory",), algorithm="hierarchical"),
)
STRATEGIES = tuple(sorted({layout.strategy for layout in ACROSS}))
#: The one-node run of a strategy whose step differs from ONE_NODE's (horovod's) on the same
#: ranks per node: a two-node run's own baseline (``--adjacent_baselines``, sets from
#: 2026-12-07 on) runs its strategy's. mlp's 1x2 step under multiworker (its
#: MultiWorkerMirroredStrategy replica context) ran 1.3 to 4.2 ms longer than under horovod,
#: its step less its exchange 1.1 to 3.3 ms, in 5 of 6 alternating pairs on the Zen 3,
#: 2026-12-07: a cost its two-node runs have, which a forecast calibrated on horovod's node
#: left in their rest.
OWN_ONE_NODE = (Layout("1x2 multiworker", 1, 2, strategy="multiworker",
                       flags=("--node_exchange=shared_memory", "--sharded_update=false"),
                       algorithm="hierarchical"),)


def one_node_of(layout: Layout) -> Layout:
    """The one-node run with ``layout``'s ranks per node that its own baseline runs: its
    strategy's where :data:`OWN_ONE_NODE` has one, else :data:`ONE_NODE`'s (horovod's; one rank
    per node: one process, no exchange, the same under every strategy)."""
    for one in (*OWN_ONE_NODE, *ONE_NODE):
        if one.local == layout.local and one.strategy in (layout.strategy, "horovod"):
            return one
    raise ValueError(f"no one-node layout with {layout.local} ranks for {layout.name}")


IDLE_BYTES = 16 * 2**20  # the message of each transport's idle host figure, round or run
#: How long each message size is timed across the link (sets from 2026-12-05 evening on; 2 s
#: before): at 1 Gbit/s a 2-second timing is 3 calls of 64 MiB, and the same call's 3-call
#: timings spread by 15-40% there (596-841 ms, one rank per node, the Xeon), more than the
#: forecast's 10%.
LINK_SECONDS = 10.0
#: Tensors per call in the grouped link timings: tfscale.cli.link_time's default for a flat
#: call (between mlp's 6 gradients and resnet50's 161; Horovod's copies through its fusion
#: buffer cost per byte, whatever the count).
GROUPED_TENSORS = link_time.TENSORS


@contextlib.contextmanager
def two_nodes() -> Iterator[None]:
    """The two-node mini-cluster up for the block, its links unshaped afterwards, and down
    again if it was down before (the machine left as it was)."""
    was_up = subprocess.run([*CLUSTER, "status"], cwd=ROOT, capture_output=True,
                            check=False).returncode == 0
    if subprocess.run([*CLUSTER, "up", "--nodes=2"], cwd=ROOT, check=False).returncode:
        sys.exit("the mini-cluster did not start (root and namespaces are needed)")
    try:
        yield
    finally:
        shape(0)
        if not was_up:
            subprocess.run([*CLUSTER, "down"], cwd=ROOT, check=False)


def _cluster(*args: str, timeout: float = 900, on: str = "") -> subprocess.CompletedProcess[str]:
    where = ["--on", on] if on else []
    return subprocess.run([*CLUSTER, "exec", *where, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, check=False)


def shape(gbit: float) -> None:
    """Limits each node's outgoing traffic to ``gbit`` Gbit/s (0: no limit). The bucket holds
    1 ms of traffic (at least 256 KiB) and its queue 20 ms, so nothing is dropped."""
    for node in NODES:
        subprocess.run(["tc", "-n", f"tfsc-{node}", "qdisc", "del", "dev", "eth0", "root"],
                       capture_output=True, check=False)
        if gbit:
            burst = max(int(gbit * 1e9 / 8 * 1e-3), 256 * 1024)
            subprocess.run(["tc", "-n", f"tfsc-{node}", "qdisc", "add", "dev", "eth0", "root",
                            "tbf", "rate", f"{gbit:g}gbit", "burst", str(burst), "latency",
                            "20ms"], check=True)


def launcher(transport: str, local: int, where: tuple[str, ...] = ("-N2",),
             mpi: bool = True) -> list[str]:
    """The command that starts ``local`` ranks on each node named by srun's ``where``:
    ``transport="mpi"`` srun (``mpi``: with ``--mpi=pmix``, Horovod over Open MPI);
    ``"gloo"`` ``horovodrun --gloo`` from the first node on both (Horovod over Gloo), as
    tfscale's generated horovodrun job script does."""
    if transport == "gloo":
        if where != ("-N2",):
            raise ValueError(f"transport='gloo' starts ranks on both nodes, not {where}")
        hosts = ",".join(f"{node}:{local}" for node in NODES)
        return [*CLUSTER, "exec", "--on", NODES[0], "horovodrun", "--gloo",
                "-np", str(len(NODES) * local), "-H", hosts,
                "--network-interface", "eth0"]  # each node's end of its link
    if transport == "mpi":
        return [*CLUSTER, "exec", "srun", *where, f"--ntasks-per-node={local}",
                *(["--mpi=pmix"] if mpi else []), "--kill-on-bad-exit=1"]
    raise ValueError(f"transport={transport!r}: expected 'mpi' or 'gloo'")


def on_both_nodes(module: str, *flags: str, local: int = 1, cycle_ms: float = 0.5,
                  timeout: float = 600, transport: str = "mpi") -> dict[str, Any]:
    """``python -m module FLAGS``, ``local`` ranks on each of the two nodes, started by
    :func:`launcher` for ``transport``, at Horovod's cycle ``cycle_ms``: the JSON object rank 0
    prints as the last line.

    Raises:
        RuntimeError: naming the module and flags, with the end of its output, when it fails.
    """
    env = {**os.environ, "HOROVOD_CYCLE_TIME": f"{cycle_ms:g}"}
    proc = subprocess.run([*launcher(transport, local), sys.executable, "-m", module, *flags],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout, env=env,
                          check=False)
    if proc.returncode:
        raise RuntimeError(f"{module} {' '.join(flags)} over {transport} failed:\n"
                           f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
    found: dict[str, Any] = json.loads(rank0_text(proc.stdout).strip().splitlines()[-1])
    return found


_RANK_PREFIX = re.compile(r"\[(\d+)\]<stdout>:")


def rank0_text(stdout: str) -> str:
    """Rank 0's lines of a launcher's ``stdout``: horovodrun prefixes every rank's lines with
    ``[rank]<stdout>:``, which this strips from rank 0's and drops with the others'; srun
    passes the ranks' lines as they are, which stay."""
    lines = []
    for line in stdout.splitlines():
        prefix = _RANK_PREFIX.match(line)
        if prefix is None:
            lines.append(line)
        elif prefix.group(1) == "0":
            lines.append(line[prefix.end():])
    return "\n".join(lines)


def link_figures(*whole_calls: str) -> dict[str, Any]:
    """Bus bandwidth of the all-reduce across the link (one rank per node): Horovod's (MPI),
    which the forecast charges, and under ``"ring"`` tfscale's ring's (multiworker's
    hierarchical cross phase; bare at 1 Gbit/s it drove the link 1.2x as fast as Open MPI, but
    charging it did not bring multiworker's runs closer, docs/FORECAST.md, 2026-12-05); and
    the link's latency; under ``"flat"`` (sets from 2026-12-05 on) Horovod's all-reduce over
    the 2x2 flat layout's four ranks, two on each node's core, with the algorithm Open MPI
    picks for it and its in-node steps (docs/FORECAST.md, 2026-12-05). Under ``"grouped"`` and
    ``"flat_grouped"`` (sets from 2026-12-05 evening on) the same two shapes with each size in
    :data:`GROUPED_TENSORS` tensors, one ``hvd.grouped_allreduce``: the call Horovod's 2x1 and
    2x2 flat runs make, Horovod's fusion-buffer copies included (the hierarchical layouts hand
    Horovod one buffer, the one-tensor call's). Under ``"ring_pair"`` (sets from 2026-12-06 on)
    tfscale's rings as multiworker's hierarchical runs cross: two ranks on each node's core,
    one ring per local index, both at once; their runs are charged it (``Layout.cross_call``).
    On the Zen 3 of 2026-12-06 at 25 Gbit/s, one ring alone moved 0.62-0.72 GB/s at 64 MiB and
    two at once 0.72-0.83 together; at 1 Gbit/s one alone and two together both 0.115. With
    ``--grpc_across``, :func:`measure` adds ``"grpc_flat"``. Under ``"hierarchical_call"`` (sets
    from 2026-12-07 evening on) multiworker's whole hierarchical exchange over the 2x2 ranks as
    its step calls it (``bench.link_allreduce_worker --hierarchical``); its runs are charged
    it (``Layout.whole_call``). On the Zen 4 of 2026-12-07 at 25 Gbit/s it took 23.2-23.8 ms
    at 16 MiB, where the node phases' figure and the rings' at 8 MiB add to about 17. A whole
    call is timed only where ``whole_calls`` names it (sets from 2026-12-07 night on: where
    the set or run has that layout; about 45 s a timing)."""
    def across(*flags: str, local: int = 1) -> dict[str, Any]:
        return on_both_nodes("bench.link_allreduce_worker", f"--seconds={LINK_SECONDS:g}",
                             *flags, local=local)

    figures = across()
    figures["ring"] = across("--ring")
    figures["ring_pair"] = across("--ring", local=2)
    if "hierarchical_call" in whole_calls:
        figures["hierarchical_call"] = across("--hierarchical", local=2)
    figures["flat"] = across(local=2)
    figures["grouped"] = across(f"--grouped={GROUPED_TENSORS}")
    figures["flat_grouped"] = across(f"--grouped={GROUPED_TENSORS}", local=2)
    server = subprocess.Popen([*CLUSTER, "exec", "--on", NODES[1], sys.executable, "-m",
                               "bench.link_pingpong", "serve", str(PORT)], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        ping = _cluster(sys.executable, "-m", "bench.link_pingpong", "ping", NODES[1], str(PORT),
                        on=NODES[0], timeout=120)
        if ping.returncode:
            raise RuntimeError(f"ping-pong failed: {ping.stderr[-1000:]}")
        figures["pingpong"] = json.loads(ping.stdout.strip().splitlines()[-1])
    finally:
        server.wait(timeout=60)
    return figures


def gloo_call_figures() -> dict[str, Any]:
    """The flat runs' grouped call over Gloo (``horovodrun --gloo``), two ranks on each node's
    core, as :func:`link_figures` times it over Open MPI (``"flat_grouped"``): what a
    ``2x2 flat gloo`` run is charged (link rows' ``"flat_grouped_gloo"``, sets from
    2026-12-05 night on)."""
    return on_both_nodes("bench.link_allreduce_worker", f"--seconds={LINK_SECONDS:g}",
                         f"--grouped={GROUPED_TENSORS}", local=2, transport="gloo")


def in_node_figures(*flags: str) -> dict[str, Any]:
    """The all-reduce between the 2 ranks of one node (its one core): tfscale's shared-memory
    exchange, or with ``--horovod`` Horovod's (Open MPI's shared memory, a flat ring's
    in-node hop)."""
    proc = _cluster("srun", "-N1", "-w", NODES[0], "--ntasks-per-node=2", "--mpi=pmix",
                    "--kill-on-bad-exit=1", sys.executable, "-m", "bench.link_allreduce_worker",
                    *flags, timeout=600)
    if proc.returncode:
        raise RuntimeError(f"in-node all-reduce failed:\n{proc.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


#: gRPC flat-ring timings per model at each end of a round: with the end's, four, whose median
#: is charged, so one timing that runs slow (3x on the Zen 3, 2026-12-03) sets nothing alone.
GRPC_TIMINGS = 2
#: Timings per model for one run's own figures (``--adjacent_figures``): the median of three.
RUN_GRPC_TIMINGS = 3


def grpc_ring_timings(models: tuple[str, ...] = tuple(MODELS),
                      count: int = GRPC_TIMINGS) -> dict[str, list[float]]:
    """Per model, ``count`` timings of gRPC's host nanoseconds per stack byte in the 2x2 flat
    ring's own topology at the model's gradient size (:func:`tfscale.cli.host_time.flat_ring`:
    four workers on the host, each node's two on one core, no link between them), in the
    model's gradient tensors as its runs hand them over (:func:`gradient_tensors`; sets from
    2026-12-06 evening on), the models taken in turn so that a slow stretch of the VM does
    not fall on one model's alone."""
    from bench.common import gradient_bytes
    from tfscale.cli.host_time import flat_ring

    timings: dict[str, list[float]] = {model: [] for model in models}
    for _ in range(count):
        for model in models:
            timings[model].append(flat_ring(gradient_bytes(model),
                                            tensors=gradient_tensors(model)))
    return timings


_TENSORS = """
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import models
from tfscale.config.train_config import TrainConfig
model = models.MODELS.get(sys.argv[1])(TrainConfig(model=sys.argv[1], image_size=int(sys.argv[2])))
print(json.dumps([int(weight.numpy().size) for weight in model.trainable_weights]))
"""


@functools.cache
def gradient_tensors(model: str) -> tuple[int, ...]:
    """The element counts of ``model``'s gradient tensors as its runs here build it (its
    ``--image_size`` in :data:`MODELS`), in the order Keras hands them to the strategy; built
    in a child process, which keeps TensorFlow out of this one.

    Raises:
        RuntimeError: when they do not hold the model's gradient bytes of the presets.
    """
    from bench.common import gradient_bytes

    size = next(flag.split("=", 1)[1] for flag in MODELS[model]
                if flag.startswith("--image_size="))
    proc = subprocess.run([sys.executable, "-c", _TENSORS, model, size], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, check=False)
    if proc.returncode:
        raise RuntimeError(f"counting {model}'s gradient tensors failed:\n{proc.stderr[-1500:]}")
    counts = tuple(json.loads(proc.stdout.strip().splitlines()[-1]))
    if 4 * sum(counts) != gradient_bytes(model):
        raise RuntimeError(f"{model}'s {len(counts)} gradient tensors hold {4 * sum(counts)} "
                           f"bytes, its presets {gradient_bytes(model)}")
    return counts


def median_figures(timings: dict[str, list[float]]) -> dict[str, float]:
    """Per model, the median of its timings (of two, their mean)."""
    return {model: statistics.median(values) for model, values in timings.items()}


def grpc_ring_figures(models: tuple[str, ...] = tuple(MODELS)) -> dict[str, float]:
    """Per model, gRPC's flat-ring figure for one run: the median of
    :data:`RUN_GRPC_TIMINGS` timings (:func:`grpc_ring_timings`)."""
    return median_figures(grpc_ring_timings(models, RUN_GRPC_TIMINGS))


def cast_figures(models: tuple[str, ...] = tuple(MODELS)) -> dict[str, float]:
    """Per model: nanoseconds per float32 byte of casting its gradients to float16 and back
    (``--fp16_allreduce``'s work around the all-reduce) on a node's one core
    (:func:`tfscale.forecast.calibrate.cast_time`)."""
    from tfscale.forecast.machines import load

    preset = load("minicluster_25gbit")
    figures = {}
    for model in models:
        nbytes = int(preset.model(model).gradient_bytes)
        proc = _cluster(sys.executable, "-c", "import sys; from tfscale.forecast.calibrate "
                        "import cast_time; print(cast_time(int(sys.argv[1])))", str(nbytes),
                        on=NODES[0], timeout=300)
        if proc.returncode:
            raise RuntimeError(f"cast timing failed:\n{proc.stderr[-2000:]}")
        figures[model] = float(proc.stdout.split()[-1])
    return figures


def run_figures(model: str, layout: Layout) -> dict[str, Any]:
    """The figures one two-node run's forecast takes, timed now (``--adjacent_figures``, just
    before the run): ``link``, its link's (as a round's link row), and ``node``, the part of
    a round's one-node row that its exchange uses: the in-node exchange it runs (shared memory
    when hierarchical, Horovod's flat ring hop), fp16's casts, and the host figure of raw TCP
    and of its strategy's transport (gRPC's in the flat ring's topology). A round's figures
    are timed at its start; this VM's exchange took 1.5x as long per byte in one half of a
    round as in the other (shaped_links_2026-11-29_epyc_adjacent)."""
    from tfscale.strategies import STRATEGIES

    strategy = STRATEGIES.get(layout.strategy)
    node: dict[str, Any] = {}
    if layout.local > 1 and layout.algorithm == "hierarchical":
        node["in_node"] = in_node_figures()
    elif layout.local > 1 and strategy.ring_hop_transport == "shared_memory":
        node["in_node_ring"] = in_node_figures("--horovod")
    if layout.fp16:
        node["cast_ns_per_byte"] = cast_figures((model,))
    transport = strategy.host_transports[layout.algorithm]
    if transport == "grpc":
        node["grpc_ring_ns_per_stack_byte"] = grpc_ring_figures((model,))
    # Raw TCP's is the machine's host figure whatever the strategy; gRPC's is timed above.
    node["idle_ns_per_byte"] = idle_figures(
        IDLE_BYTES, ("tcp",) if transport in ("tcp", "grpc") else ("tcp", transport))
    link = link_figures(layout.whole_call) if layout.whole_call else link_figures()
    if layout.transport == "gloo":
        link["flat_grouped_gloo"] = gloo_call_figures()
    return {"link": link, "node": node}


def _steady_windows(stdout: str) -> list[tuple[int, float, float | None]]:
    """(steps, images/s, exchange share) of a run's progress intervals after the first: a
    job's first steps after the compiled one still warm up (Horovod's first negotiation of
    each tensor, the fusion buffer's allocation; a resnet50 step 2 across nodes took 1.6 s
    against 1.25 after it, 2026-11-28), and over a few steps that alone moves the mean."""
    intervals = []
    last = 1  # the first (compiled) step is never in a progress rate
    for step, rate, share in progress_windows(stdout):
        intervals.append((step - last, rate, share))
        last = step
    return intervals[1:]


def steady_rate(stdout: str) -> float | None:
    """Images/s over the progress intervals after the first (None with fewer than two)."""
    later = _steady_windows(stdout)
    if not later:
        return None
    return sum(steps for steps, _, _ in later) / sum(steps / rate for steps, rate, _ in later)


def steady_exchange_share(stdout: str) -> float | None:
    """The share of the same intervals' time (as :func:`steady_rate`'s) that the steps waited
    for their gradient exchange, by tfscale's clock in the step (:mod:`tfscale.exchange.timing`;
    each line's share, to 1%, weighted by its interval's time); None where a line has none."""
    later = _steady_windows(stdout)
    if not later or any(share is None for _, _, share in later):
        return None
    return (sum(steps / rate * (share or 0.0) for steps, rate, share in later)
            / sum(steps / rate for steps, rate, _ in later))


#: What a run's ranks run: tfscale.train, as a user would.
TRAIN = ("-m", "tfscale.train")


def _train_command(model: str, layout: Layout, where: list[str], model_dir: Path,
                   timeline: bool = False, entry: tuple[str, ...] = TRAIN) -> list[str]:
    start = launcher(layout.transport, layout.local, tuple(where),
                     mpi=layout.strategy != "multiworker")
    return [*start, sys.executable, *entry, *MODELS[model],
            f"--strategy={layout.strategy}", *layout.flags, "--learning_rate=0.01",
            "--tensorboard=false", f"--model_dir={model_dir}",
            *(["--horovod_timeline"] if timeline else [])]


# The part of a run's timeline left out of its summary: about the first progress interval,
# which steady_rate leaves out too (mlp's first 200 of 1,000 steps, resnet50's first 4 of 24,
# with the start-up's broadcasts and first negotiations).
TIMELINE_SKIP = 0.2


def train(model: str, layout: Layout, timeline: bool = False,
          entry: tuple[str, ...] = TRAIN) -> dict[str, Any]:
    """One run of tfscale.train under srun on the cluster: its results.json, with
    ``steady_images_per_sec`` (:func:`steady_rate`) and ``steady_exchange_share``
    (:func:`steady_exchange_share`). A one-node run runs on both nodes at once,
    as two separate jobs, and reports the first node's (``neighbour_images_per_sec``: the
    other's): the nodes of this cluster share one machine's cache and memory, which a two-node
    run keeps busy on both, so its one-node baseline must too (resnet50 on one core ran 5%
    slower with the same job on the other core, 2026-11-28); real nodes share neither.
    ``timeline`` (a layout with :attr:`Layout.has_timeline`): the run writes Horovod's
    timeline, and its summary per activity (rank 0's, after ``TIMELINE_SKIP`` of it) is the
    result's ``timeline``. ``entry``: what the ranks run in place of ``-m tfscale.train``,
    with its flags (bench.step_windows' stamped one)."""
    with tempfile.TemporaryDirectory(dir=OUT) as tmp:
        nodes = [["-N2"]] if layout.nodes == 2 else [["-N1", "-w", node] for node in NODES]
        procs = [subprocess.Popen(_train_command(model, layout, where, Path(tmp) / f"run{i}",
                                                 timeline, entry),
                                  cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
                 for i, where in enumerate(nodes)]
        try:
            outputs = [proc.communicate(timeout=900) for proc in procs]
        finally:  # one that timed out, or whose twin did, is not left running
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
        for proc, (stdout, stderr) in zip(procs, outputs, strict=True):
            if proc.returncode:
                raise RuntimeError(f"{model} {layout.name} failed:\n{stdout[-2000:]}"
                                   f"{stderr[-2000:]}")
        found = [json.loads((Path(tmp) / f"run{i}" / "results.json").read_text())
                 for i in range(len(procs))]
        results: dict[str, Any] = found[0]
        rank0 = rank0_text(outputs[0][0])
        results["steady_images_per_sec"] = steady_rate(rank0)
        # Rank 0's: the step's own exchange, set against the forecast's (sets from
        # 2026-12-06 afternoon on; shaped_links_report.step_split_rows).
        results["steady_exchange_share"] = steady_exchange_share(rank0)
        if len(found) > 1:
            results["neighbour_images_per_sec"] = (steady_rate(outputs[1][0])
                                                   or found[1]["images_per_sec"])
        if timeline:
            # A run without its timeline keeps its images/s and says why, not stops the set
            # (ddl's first one, 2026-12-04, was not written: Horovod only warned).
            path = Path(tmp) / "run0" / TIMELINE_FILE
            try:
                results["timeline"] = [dataclasses.asdict(activity) for activity in
                                       summarize(load(path), TIMELINE_SKIP)]
            except (OSError, ValueError) as err:
                results["timeline_error"] = f"{path.name}: {err}"
        return results


def kept_of(result: dict[str, Any]) -> dict[str, Any]:
    """What a set keeps of one run's :func:`train` result: its rates, its exchange's share of
    the step (sets from 2026-12-06 afternoon on), what it ran, and its timeline if any."""
    return {"images_per_sec": result["images_per_sec"],
            "steady_images_per_sec": result["steady_images_per_sec"],
            "steady_exchange_share": result.get("steady_exchange_share"),
            "neighbour_images_per_sec": result.get("neighbour_images_per_sec"),
            "step_time_ms": result.get("step_time_ms"),
            "exchange": result.get("exchange"), "hosts": result.get("hosts"),
            "num_workers": result["num_workers"],
            **{key: result[key] for key in ("timeline", "timeline_error") if key in result}}


#: A one-node baseline: (its images/s, the other node's), and its exchange's share of the step.
Baseline = tuple[tuple[float, float | None], float | None]


def measure(links: list[float], rounds: int, earlier: dict[str, Any] | None = None,
            layouts: tuple[Layout, ...] = ACROSS, adjacent: bool = False,
            figures: bool = False, bracketed: bool = False,
            timelines: bool = False, grpc_across: bool | None = None,
            models: tuple[str, ...] = tuple(MODELS)) -> dict[str, Any]:
    """Every link's figures and runs once per round, the order reversed in odd rounds; with
    ``earlier`` (a saved result), its rounds are kept and these continue their count.
    ``layouts``: the two-node runs (the one-node runs always run, for their baselines).
    ``adjacent``: each two-node run also gets its own baseline, the one-node run with its
    ranks per node run just before it (``baseline_images_per_sec``): this VM's speed drifted
    by a quarter within half an hour (bench.shaped_link_pairs, 2026-11-29), more than a
    round's one baseline, minutes away, can stand for. ``figures``: each two-node run also
    gets the figures its forecast takes timed just before it (:func:`run_figures`).
    ``bracketed`` (with ``adjacent``): each two-node run also gets the same baseline run just
    after it (``after_baseline_images_per_sec``), which is the next run's before-baseline
    where that run follows at once with the same model and ranks per node: baseline and run
    alternate, B R B R B, and a drift that is linear over one run's minutes cancels in the
    mean of the two around it. ``timelines``: each Horovod run across nodes (horovod, ddl)
    also writes Horovod's timeline, kept summed per activity (:func:`train`). ``grpc_across``:
    each link's row also times gRPC's flat ring across it, as multiworker's 2x2 flat runs
    cross (``"grpc_flat"``: TensorFlow's gRPC ring over the four ranks, each node's two on its
    one core, at each model's gradient size, ``bench.grpc_link_time.link_row``), which those
    runs are charged; by default (``None``) where the set runs that layout.
    ``models``: the models whose runs, baselines and figures the set takes (an ``--append``
    keeps the saved result's); mlp's took two fifths of a set of both on the Zen 3."""
    OUT.mkdir(parents=True, exist_ok=True)
    runs: list[dict[str, Any]] = list(earlier["runs"]) if earlier else []
    link_rows: list[dict[str, Any]] = list(earlier["links"]) if earlier else []
    first = 1 + max((r["round"] for r in runs), default=-1)
    if earlier:
        models = tuple(earlier["models"])
    cases = [(gbit, model, layout) for gbit in links for model in models for layout in layouts]
    cases += [(0.0, model, layout) for model in models for layout in ONE_NODE]
    # "when" is the set's first start (an --append keeps it); each round notes its own.
    now = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    header = {"cpu": cpu_description(), "rounds": first + rounds,
              "models": {model: MODELS[model] for model in models},
              "when": earlier.get("when", now) if earlier else now}
    # gRPC's flat-ring figure is charged to multiworker's flat runs only.
    times_grpc = any(layout.strategy == "multiworker" and layout.algorithm == "flat"
                     for layout in layouts)
    if grpc_across is None:  # the call the flat runs are charged, where the set has them
        grpc_across = any(layout.cross_call == "grpc_flat" for layout in layouts)
    whole_calls = sorted({layout.whole_call for layout in layouts} - {""})
    def baseline(model: str, one_node: Layout) -> Baseline:
        result = train(model, one_node)
        return ((result["steady_images_per_sec"] or result["images_per_sec"],
                 result.get("neighbour_images_per_sec")), result.get("steady_exchange_share"))

    for round_ in range(first, first + rounds):
        # The baseline just run after a two-node run, kept for the next if it has the same
        # model and one-node layout (then nothing else runs between the two).
        after: tuple[str, str, Baseline] | None = None
        shape(0)
        grpc_ring = grpc_ring_timings(models) if times_grpc else {}
        link_rows.append({"round": round_, "gbit": 0.0,
                          "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                          "in_node": in_node_figures(),
                          "in_node_ring": in_node_figures("--horovod"),
                          "cast_ns_per_byte": cast_figures(models),
                          "idle_ns_per_byte": idle_figures(IDLE_BYTES),
                          "grpc_ring_timings": grpc_ring,
                          "grpc_ring_ns_per_stack_byte": median_figures(grpc_ring)})
        node_row = link_rows[-1]
        for gbit in in_round_order(links, round_):
            shape(gbit)
            link_rows.append({"round": round_, "gbit": gbit, **link_figures(*whole_calls)})
            if grpc_across:
                # multiworker flat's own call across the link, charged to its runs
                # (bench.shaped_links_report.CHARGED_CROSS_CALLS).
                from bench.grpc_link_time import link_row

                link_rows[-1]["grpc_flat"] = link_row(models)
            if any(layout.transport == "gloo" for layout in layouts):
                link_rows[-1]["flat_grouped_gloo"] = gloo_call_figures()
            timed = link_rows[-1]
            best = {name: max(s["busbw_GBps"] for s in timed[name]["sizes"])
                    for name in ("ring", "grouped", "flat", "flat_grouped")}
            mpi = max(s["busbw_GBps"] for s in timed["sizes"])
            together = ""
            if "ring_pair" in timed:
                from bench.shaped_links_report import rings_together

                both = max(s["busbw_GBps"] for s in rings_together(timed["ring_pair"])["sizes"])
                together = f", two at once {both:.3f}"
            if "hierarchical_call" in timed:
                whole = max(s["busbw_GBps"] for s in timed["hierarchical_call"]["sizes"])
                together += f"; multiworker's hierarchical call {whole:.3f}"
            if "grpc_flat" in timed:
                together += "; gRPC's flat ring " + ", ".join(
                    f"{size['model']} {size['busbw_GBps']:.3f}"
                    for size in timed["grpc_flat"]["sizes"])
            print(f"[round {round_}] {gbit:g} Gbit/s: busbw {mpi:.3f} GB/s, grouped "
                  f"{best['grouped']:.3f} (tfscale's ring {best['ring']:.3f}{together}; "
                  f"Horovod over 2x2 "
                  f"ranks {best['flat']:.3f}, grouped {best['flat_grouped']:.3f}), "
                  f"latency {timed['pingpong']['latency_us']:.0f} us", flush=True)
        for gbit, model, layout in in_round_order(
                sorted(cases, key=lambda c: (c[0], c[1])), round_):
            shape(gbit)
            start = time.monotonic()
            adjacent_to: dict[str, Any] = {}
            one_node = one_node_of(layout)
            if adjacent and layout.uses_link:
                # The baseline's exchange share (sets from 2026-12-07 on): the node's own rest
                # for the report's split (bench.shaped_links_report.step_split_rows).
                adjacent_to["baseline_layout"] = one_node.name
                (adjacent_to["baseline_images_per_sec"],
                 adjacent_to["baseline_exchange_share"]) = (
                    after[2] if after and after[:2] == (model, one_node.name)
                    else baseline(model, one_node))
            after = None
            if figures and layout.uses_link:
                adjacent_to["figures"] = run_figures(model, layout)
            result = train(model, layout, timelines and layout.has_timeline)
            runs.append({"round": round_, "gbit": gbit, "model": model, "layout": layout.name,
                         **adjacent_to, **kept_of(result), "wall_s": time.monotonic() - start})
            if bracketed and layout.uses_link:
                after = (model, one_node.name, baseline(model, one_node))
                runs[-1]["after_baseline_images_per_sec"] = after[2][0]
            print(f"[round {round_}] {gbit:g} Gbit/s {model} {layout.name}: "
                  f"{result['images_per_sec']:.1f} images/s, after the first interval "
                  f"{result['steady_images_per_sec'] or float('nan'):.1f}"
                  + (f", exchange {result['steady_exchange_share']:.0%} of the step"
                     if result.get("steady_exchange_share") is not None else "")
                  + f" ({result.get('exchange')})"
                  + (f"; no timeline: {result['timeline_error']}"
                     if "timeline_error" in result else ""),
                  flush=True)
            save("shaped_links", {**header, "partial": True, "links": link_rows, "runs": runs})
        if times_grpc:
            # gRPC's figure again at the round's end: one 3-second timing swung by up to 45%
            # between rounds (the grpc_topology set), more than the runs it is charged to, and
            # one ran 3x slow (the Zen 3, 2026-12-03). The round's figure is the median of all
            # its timings; each is kept.
            shape(0)
            ends = grpc_ring_timings(models)
            for model, values in ends.items():
                grpc_ring[model].extend(values)
            node_row["grpc_ring_ns_per_stack_byte"] = median_figures(grpc_ring)
            save("shaped_links", {**header, "partial": True, "links": link_rows, "runs": runs})
    shape(0)
    return {**header, "links": link_rows, "runs": runs}


@ends_quietly
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--links", default="1,10,25", help="Gbit/s, comma-separated")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--report", action="store_true", help="only the tables of the last run")
    parser.add_argument("--result", type=Path, action="append", default=[],
                        help="with --report: the saved result to tabulate (default: the last "
                             "run's; e.g. a kept one in docs/forecast/); given again, the "
                             "sets are tabulated as the rounds of one, each run and link "
                             "forecast from its own set's figures and baselines, the "
                             "measured and forecast rates meant over them")
    parser.add_argument("--append", action="store_true",
                        help="add --rounds rounds to the saved result (its links only)")
    parser.add_argument("--models", default=",".join(MODELS),
                        help=f"comma-separated models to measure (default: {','.join(MODELS)}): "
                             "their runs, baselines and figures; the others' are left out")
    parser.add_argument("--layouts", default="",
                        help="comma-separated two-node runs to measure (default: all; e.g. "
                             "'2x2 hierarchical,2x2 multiworker hierarchical')")
    parser.add_argument("--adjacent_baselines", action="store_true",
                        help="run each two-node run's one-node baseline just before it, "
                             "under its strategy (the forecast of that run is calibrated on "
                             "it, not on the round's)")
    parser.add_argument("--bracketed_baselines", action="store_true",
                        help="with --adjacent_baselines: also run each two-node run's one-node "
                             "baseline just after it (the next run's before-baseline where it "
                             "has the same model and one-node run); its forecast is "
                             "calibrated on the mean of the two")
    parser.add_argument("--before_only", action="store_true",
                        help="with --report: calibrate every run on its baseline before it "
                             "only, where the set also ran one after (--bracketed_baselines): "
                             "the two side by side")
    parser.add_argument("--adjacent_figures", action="store_true",
                        help="time the figures each two-node run's forecast takes (its link, "
                             "in-node exchange, casts, host time per byte) just before it, and "
                             "forecast that run from them, not from the round's")
    parser.add_argument("--horovod_timelines", action="store_true",
                        help="each horovod and ddl run across nodes also writes Horovod's "
                             "timeline (rank 0's), kept summed per activity; the report sets "
                             "it per step beside the forecast's exchange")
    parser.add_argument("--grpc_across", action=argparse.BooleanOptionalAction, default=None,
                        help="each link's row also times TensorFlow's gRPC ring over the 2x2 "
                             "flat layout's ranks across the link, three times per model: "
                             "multiworker flat's own call, which its runs are then charged "
                             "(docs/FORECAST.md); by default where the set runs that layout, "
                             "--no-grpc_across leaves it out (its runs are charged Open MPI's "
                             "link figure and gRPC's host figure)")
    parser.add_argument("--round_figures", action="store_true",
                        help="with --report: forecast every run from its round's figures even "
                             "where the set timed its own beside it (--adjacent_figures): the "
                             "two side by side")
    parser.add_argument("--host_ns", action="append", default=[], metavar="STRATEGY=NS",
                        help="with --report: charge STRATEGY's runs NS nanoseconds of host "
                             "time per byte instead of the preset's (a what-if, e.g. "
                             "multiworker=6.9 from bench.transport_host_time's gRPC); repeatable")
    args = parser.parse_args()
    if (args.adjacent_baselines or args.adjacent_figures or args.bracketed_baselines
            or args.horovod_timelines or args.grpc_across is not None) and args.report:
        parser.error("--adjacent_baselines, --bracketed_baselines, --adjacent_figures, "
                     "--horovod_timelines and --grpc_across go with a measurement, not "
                     "--report (a result that has them is reported with them)")
    if args.bracketed_baselines and not args.adjacent_baselines:
        parser.error("--bracketed_baselines adds a baseline after each run to the one before "
                     "it: give it with --adjacent_baselines")
    if (args.result or args.host_ns or args.round_figures or args.before_only) \
            and not args.report:
        parser.error("--result, --host_ns, --round_figures and --before_only go with --report "
                     "(a measurement saves into bench/results/ and forecasts with the presets)")
    host_ns = host_ns_flags(parser, args.host_ns)
    by_name = {layout.name: layout for layout in ACROSS}
    wanted = [name.strip() for name in args.layouts.split(",") if name.strip()]
    unknown = [name for name in wanted if name not in by_name]
    if unknown:
        parser.error(f"--layouts: {', '.join(map(repr, unknown))} not among "
                     f"{', '.join(by_name)}")
    layouts = tuple(by_name[name] for name in wanted) or ACROSS
    models = tuple(name.strip() for name in args.models.split(",") if name.strip())
    if not models or any(name not in MODELS for name in models):
        parser.error(f"--models={args.models!r}: expected a comma-separated list of "
                     f"{', '.join(MODELS)}")
    if args.models != ",".join(MODELS) and (args.report or args.append):
        parser.error("--models chooses what a new measurement runs; --report tabulates, and "
                     "--append continues, every model of the saved result")
    if not args.report:
        earlier = json.loads((OUT / "shaped_links.json").read_text()) if args.append else None
        with two_nodes():
            save("shaped_links", measure([float(x) for x in args.links.split(",")],
                                         args.rounds, earlier, layouts,
                                         args.adjacent_baselines, args.adjacent_figures,
                                         args.bracketed_baselines, args.horovod_timelines,
                                         args.grpc_across, models))
    from bench.shaped_links_report import report

    # Its report goes to a pipe as often as to a terminal (| head): ends_quietly ends the
    # command there without a BrokenPipeError traceback.
    try:
        result = as_rounds([json.loads(path.read_text())
                            for path in args.result or [OUT / "shaped_links.json"]])
    except ValueError as error:
        parser.error(f"--result: {error}")
    for run in result["runs"]:
        if args.round_figures:
            run.pop("figures", None)
        if args.before_only:
            run.pop("after_baseline_images_per_sec", None)
    print(report(result, host_ns))
    return 0


def as_rounds(results: list[dict[str, Any]]) -> dict[str, Any]:
    """Several saved sets as the rounds of one: each set's rounds numbered on after the
    previous set's, its links and runs kept with them (so each run is forecast from its own
    set's figures and baselines); one set as it is.

    Raises:
        ValueError: where two sets ran a model with different flags (a mean over them would
            mix two workloads).
    """
    if len(results) == 1:
        return results[0]
    merged: dict[str, Any] = {**results[0], "links": [], "runs": [], "models": {}}
    offset = 0
    for number, result in enumerate(results, 1):
        for model, flags in result["models"].items():
            if merged["models"].setdefault(model, flags) != flags:
                raise ValueError(f"set {number} ran {model} with {' '.join(flags)}, an earlier "
                                 f"one with {' '.join(merged['models'][model])}")
        rounds = {row["round"] for row in [*result["links"], *result["runs"]]}
        merged["links"] += [{**row, "round": row["round"] + offset} for row in result["links"]]
        merged["runs"] += [{**run, "round": run["round"] + offset} for run in result["runs"]]
        offset += max(rounds, default=-1) + 1
    merged["rounds"] = offset
    return merged


def host_ns_flags(parser: argparse.ArgumentParser, values: list[str]) -> dict[str, float]:
    """``--host_ns STRATEGY=NS`` values as {strategy: ns}; a malformed one stops the parser."""
    out = {}
    for value in values:
        strategy, _, ns = value.partition("=")
        try:
            out[strategy] = float(ns)
        except ValueError:
            out[strategy] = -1.0
        if strategy not in STRATEGIES or out[strategy] < 0:
            parser.error(f"--host_ns={value!r}: expected STRATEGY=NS with STRATEGY one of "
                         f"{', '.join(STRATEGIES)} and NS a number of nanoseconds >= 0")
    return out


if __name__ == "__main__":
    sys.exit(main())
