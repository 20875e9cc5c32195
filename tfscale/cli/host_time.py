"""The host time per byte of an all-reduce through multiworker's transports, on one core.

Two TF_CONFIG workers, both pinned to this process's first core, all-reduce ``NBYTES`` of
float32 over and over, through tfscale's ring as multiworker's cross-node phase calls it
(``ring``) or through TensorFlow's collective over the cluster's gRPC (``grpc``: multiworker's
flat ring, under ``--node_exchange=collectives``); each worker is
:func:`tfscale.exchange.host_time.seconds_per_call`. Each byte's send and receive both run on
that core, as raw TCP's figure of ``tfscale.forecast --calibrate`` is taken; with ``--busy`` a
third process computes there. Prints one JSON line: ``{"transport", "nbytes", "busy",
"ns_per_byte"}``, nanoseconds per all-reduced byte (the slower worker's).

With ``--flat_ring`` (``grpc`` only) the all-reduce runs in the topology of multiworker's flat
ring across two nodes whose two ranks share a core: four workers, ranks 0 and 1 on this
process's first core and 2 and 3 on its second, one gRPC ring over them (it crosses between
the cores twice). The figure is then nanoseconds per byte that one node's ranks put through
the network stack (``"ns_per_stack_byte"``, :func:`tfscale.forecast.model.host_bytes`), the
unit the forecast charges. Two workers on one core overstate gRPC's flat ring by about 1.5x at
mlp's size (docs/FORECAST.md, "gRPC's flat ring in its own topology").

    python -m tfscale.cli.host_time {ring,grpc} NBYTES [--seconds 3] [--busy]
    python -m tfscale.cli.host_time grpc NBYTES --flat_ring [--tensors N,N,...]

gRPC's all-reduce is called as a training step calls it: the bytes in a list of tensors
(``--tensors``: a model's gradients' element counts; by default one tensor), which the strategy
packs into one, sums and splits; only one value of the sum is read back.

``tfscale.forecast --calibrate`` writes the ring's figure and gRPC's (in the flat ring's
topology where the node has two cores) into a machine file; ``bench.transport_host_time``
and ``bench.shaped_links`` take them in their rounds.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
from collections.abc import Callable, Sequence
from typing import Any

from tfscale.cli import command
from tfscale.cluster.environment import tf_config_envs
from tfscale.exchange.host_time import TRANSPORTS, seconds_per_call, tensor_counts
from tfscale.forecast.model import FLAT_RING_LOCAL, FLAT_RING_NODES, host_bytes

_BURN = ("import numpy as np\na = np.random.rand(256, 256)\n"
         "while True:\n    a = np.tanh(a @ a)\n")
_NS_PER_BYTE = 6.0  # gRPC's, roughly: sizes the workers' runs to about --seconds


def measure(transport: str, nbytes: int, seconds: float = 3.0, busy: bool = False,
            timeout_s: float = 300.0, tensors: Sequence[int] = ()) -> float:
    """Host nanoseconds per byte of an all-reduce of ``nbytes`` through ``transport`` between
    two workers on one core (with a third process computing there when ``busy``); ``tensors``
    as :func:`tfscale.exchange.host_time.seconds_per_call` takes them.

    Raises:
        ValueError: for a transport other than ``ring`` or ``grpc``.
        RuntimeError: when a worker fails, with the end of its error output.
    """
    core = min(os.sched_getaffinity(0))
    return time_workers(transport, nbytes, [core, core], seconds, busy, timeout_s,
                        tensors) / nbytes * 1e9


def flat_ring(nbytes: int, seconds: float = 3.0, timeout_s: float = 600.0,
              tensors: Sequence[int] = ()) -> float:
    """Host nanoseconds per stack byte of gRPC's flat ring over two nodes of two ranks each
    sharing a core (see the module's text), for an all-reduce of ``nbytes`` (in ``tensors``,
    a model's gradient tensors' element counts, where given).

    Raises:
        RuntimeError: with fewer than two cores to run on, or when a worker fails.
    """
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < FLAT_RING_NODES:
        raise RuntimeError(f"the flat ring is timed with one core per node, {FLAT_RING_NODES} "
                           f"cores; this process may use {cores}")
    per_call = time_workers("grpc", nbytes, [cores[rank // FLAT_RING_LOCAL] for rank in
                                             range(FLAT_RING_LOCAL * FLAT_RING_NODES)],
                            seconds, timeout_s=timeout_s, tensors=tensors)
    return per_call / host_bytes(nbytes, "flat", FLAT_RING_LOCAL, FLAT_RING_NODES, "tcp") * 1e9


def time_workers(transport: str, nbytes: int, cores: Sequence[int], seconds: float = 3.0,
                 busy: bool = False, timeout_s: float = 300.0,
                 tensors: Sequence[int] = ()) -> float:
    """Seconds per all-reduce of ``nbytes`` through ``transport`` among ``len(cores)`` workers
    (the slowest's), worker ``i`` pinned to ``cores[i]``; with a process computing on the first
    worker's core when ``busy``. ``ring`` takes two workers; ``grpc`` one ring over them all,
    of the bytes in ``tensors`` where given (``seconds_per_call``).

    Raises:
        ValueError: for a transport other than ``ring`` or ``grpc``, or a ring not of two.
        RuntimeError: when a worker fails, with the end of its error output.
    """
    if transport not in TRANSPORTS:
        raise ValueError(f"transport={transport!r}; expected one of {', '.join(TRANSPORTS)}")
    if transport == "ring" and len(cores) != 2:
        raise ValueError(f"the ring is timed between 2 workers, not {len(cores)}")
    calls = max(3, round(seconds / (nbytes * _NS_PER_BYTE * 1e-9)))
    procs: list[subprocess.Popen[Any]] = []
    try:
        if busy:
            procs.append(subprocess.Popen([sys.executable, "-c", _BURN],
                                          preexec_fn=_pinned(cores[0])))
        workers = [subprocess.Popen(
            [sys.executable, "-m", "tfscale.cli.host_time", "--worker", transport,
             str(nbytes), "--calls", str(calls),
             *(["--tensors", ",".join(map(str, tensors))] if tensors else [])],
            env={**os.environ, **env}, preexec_fn=_pinned(core), stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True)
            for core, env in zip(cores, tf_config_envs(len(cores)), strict=True)]
        procs += workers
        per_call = []
        for worker in workers:
            out, err = worker.communicate(timeout=timeout_s)
            if worker.returncode != 0:
                raise RuntimeError(f"the {transport} host-time worker failed (exit "
                                   f"{worker.returncode}):\n{err[-2000:]}")
            per_call.append(json.loads(out.strip().splitlines()[-1])["seconds_per_call"])
        return max(per_call)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait()


def _pinned(core: int) -> Callable[[], None]:
    """A ``preexec_fn`` that pins the child to ``core``."""
    return functools.partial(os.sched_setaffinity, 0, {core})


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("transport", choices=TRANSPORTS)
    parser.add_argument("nbytes", type=int, help="bytes all-reduced per call (a multiple of 4)")
    parser.add_argument("--seconds", type=float, default=3.0, help="of all-reduces to time")
    parser.add_argument("--busy", action="store_true", help="a third process computes there")
    parser.add_argument("--flat_ring", action="store_true",
                        help="grpc only: time the flat ring of two nodes of two ranks, each "
                             "node's ranks on one core; prints ns per stack byte")
    parser.add_argument("--tensors", default="",
                        help="grpc only: the element counts of the float32 tensors NBYTES is "
                             "in, comma-separated (a model's gradients, which the strategy "
                             "packs into one and splits after the sum); default one tensor")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--calls", type=int, default=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.nbytes < 4 or args.nbytes % 4:
        parser.error(f"NBYTES={args.nbytes}: expected a positive multiple of 4 (float32)")
    if args.flat_ring and (args.transport != "grpc" or args.busy):
        parser.error("--flat_ring times TensorFlow's gRPC ring on idle cores: it goes with "
                     f"grpc and without --busy, not {args.transport}"
                     + (" --busy" if args.busy else ""))
    tensors = _counts(parser, args.tensors, args.transport, args.nbytes)
    if args.worker:
        command.import_tensorflow()
        print(json.dumps({"seconds_per_call": seconds_per_call(args.transport, args.nbytes,
                                                               args.calls, tensors)}))
        return 0
    if args.flat_ring:
        print(json.dumps({"transport": args.transport, "nbytes": args.nbytes,
                          "topology": f"{FLAT_RING_NODES} nodes x {FLAT_RING_LOCAL} ranks on "
                                      "one core each, one flat ring",
                          "tensors": len(tensors) or 1,
                          "ns_per_stack_byte": flat_ring(args.nbytes, args.seconds,
                                                         tensors=tensors)}))
        return 0
    print(json.dumps({"transport": args.transport, "nbytes": args.nbytes, "busy": args.busy,
                      "ns_per_byte": measure(args.transport, args.nbytes, args.seconds,
                                             args.busy, tensors=tensors)}))
    return 0


def _counts(parser: argparse.ArgumentParser, text: str, transport: str,
            nbytes: int) -> list[int]:
    """``--tensors``' element counts (none when not given), checked as the workers take them
    (:func:`tfscale.exchange.host_time.tensor_counts`)."""
    if not text:
        return []
    shown = f"--tensors={text[:60]}{'...' if len(text) > 60 else ''}"
    try:
        counts = [int(count) for count in text.split(",")]
    except ValueError:
        parser.error(f"{shown}: expected positive whole numbers, comma-separated, summing to "
                     f"NBYTES/4 = {nbytes // 4}")
    try:
        return tensor_counts(transport, nbytes, counts)
    except ValueError as error:
        parser.error(f"{shown}: {error}")


if __name__ == "__main__":
    sys.exit(main())
