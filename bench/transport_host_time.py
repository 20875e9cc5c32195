"""The host time per byte of an exchange, by transport: raw TCP (what ``--calibrate`` measures
and the forecast charges), tfscale's ring over TCP (multiworker's cross-node phase) and
TensorFlow's collective over gRPC (what carried that phase before the ring).

Each is an all-reduce between two processes on one core, so each byte's send and receive
both run on it; ``busy``: with a third process computing on that core, ``idle``: without.
``tcp`` is ``tfscale.forecast.calibrate.host_time`` (NumPy over a loopback socket); ``ring``
and ``grpc`` are :mod:`tfscale.cli.host_time`, two TF_CONFIG workers calling the phase as
a training step does. Each round measures every size and transport, in order and reversed in
turn; figures are medians over the rounds of nanoseconds per all-reduced byte.

    python -m bench.transport_host_time [--rounds 2 --mib 4.5,16,48]
"""

from __future__ import annotations

import argparse
import json
import statistics
from typing import Any

from bench.common import cpu_description, in_round_order, save, table
from tfscale.cli.host_time import measure as transport_ns_per_byte

TRANSPORTS = ("tcp", "ring", "grpc")
_SECONDS = 3.0  # of all-reduces per measurement


def idle_figures(nbytes: int, transports: tuple[str, ...] = TRANSPORTS) -> dict[str, float]:
    """Each of ``transports``' idle figure at ``nbytes`` (what ``bench.shaped_links`` takes in
    every round: the exchange there runs after the backward pass)."""
    from tfscale.forecast.calibrate import host_time

    return {transport: host_time(nbytes, _SECONDS)[0] if transport == "tcp"
            else transport_ns_per_byte(transport, nbytes, _SECONDS) for transport in transports}


def measure(rounds: int, mib: list[float]) -> dict[str, Any]:
    from tfscale.forecast.calibrate import host_time

    runs: list[dict[str, Any]] = []
    for r in range(rounds):
        for size in in_round_order(mib, r):
            nbytes = int(size * 2**20) // 4 * 4
            for transport in in_round_order(TRANSPORTS, r):
                if transport == "tcp":
                    idle, busy = host_time(nbytes, _SECONDS)
                else:
                    got = {busy: transport_ns_per_byte(transport, nbytes, _SECONDS, busy)
                           for busy in in_round_order((False, True), r)}
                    idle, busy = got[False], got[True]
                runs.append({"round": r, "mib": size, "transport": transport,
                             "idle": idle, "busy": busy})
                print(json.dumps(runs[-1]), flush=True)
    return {"cpu": cpu_description(), "rounds": rounds, "runs": runs, "rows": rows(runs)}


def rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per size and transport: medians over the rounds, and each over raw TCP's."""
    out = []
    for size in sorted({run["mib"] for run in runs}):
        medians = {}
        for transport in TRANSPORTS:
            mine = [run for run in runs if run["mib"] == size and run["transport"] == transport]
            row: dict[str, Any] = {"MiB": size, "transport": transport}
            for state in ("idle", "busy"):
                values = [run[state] for run in mine]
                row[f"{state} ns/B"] = medians[transport, state] = statistics.median(values)
                row[f"{state} range"] = f"{min(values):.2f}-{max(values):.2f}"
            out.append(row)
            for state in ("idle", "busy"):
                row[f"{state} / tcp"] = medians[transport, state] / medians["tcp", state]
    return out


def report(result: dict[str, Any]) -> str:
    return (f"CPU: {result['cpu']}; {result['rounds']} rounds\n\n"
            + table(result["rows"], ["MiB", "transport", "idle ns/B", "idle range",
                                     "busy ns/B", "busy range", "idle / tcp", "busy / tcp"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--mib", default="4.5,16,48",
                        help="comma-separated all-reduce sizes in MiB")
    args = parser.parse_args()
    result = measure(args.rounds, [float(v) for v in args.mib.split(",")])
    save("transport_host_time", result)
    print(report(result))


if __name__ == "__main__":
    main()
