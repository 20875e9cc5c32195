"""bench.grpc_link_time's arithmetic: the time a shaped link adds to gRPC's flat ring, set
against the wire's own time at the link's rate."""

from __future__ import annotations

import pytest

from bench import grpc_link_time
from bench.common import pool_rounds


def test_the_report_sets_what_a_shaped_link_adds_against_the_wires_own_time() -> None:
    nbytes = 8_000_000
    # Four ranks in one ring: each hop carries 2 x 3/4 of the message, the crossing ones at
    # the link's rate (10 Gbit/s: 1.25 GB/s).
    wire = grpc_link_time.wire_s(nbytes, 10.0)
    assert wire == pytest.approx(1.5 * nbytes / 1.25e9)
    base = 0.050

    def run(round_: int, gbit: float, seconds: float) -> dict[str, object]:
        return {"round": round_, "gbit": gbit, "model": "mlp", "nbytes": nbytes,
                "seconds_per_call": seconds}

    adds = [run(0, 0.0, base), run(0, 10.0, base + wire), run(0, 25.0, base),
            run(1, 25.0, base), run(1, 10.0, base + wire), run(1, 0.0, base)]
    lines = grpc_link_time.report({"cpu": "test", "rounds": 2, "runs": adds}).splitlines()
    ratio = {line.split("|")[2].strip(): line.split("|")[-2].strip() for line in lines
             if "Gbit/s" in line}
    assert ratio == {"10 Gbit/s": "1", "25 Gbit/s": "0"}  # the wire adds; the faster link hides


def test_what_a_link_adds_is_paired_within_each_round_and_results_pool() -> None:
    """The time a shaped link adds is set against the same round's unshaped time, so a VM
    that runs a whole round slower (drift) adds nothing; several saved results pool their
    rounds, numbered on, and results from different CPUs are refused."""
    nbytes = 8_000_000
    wire = grpc_link_time.wire_s(nbytes, 10.0)

    def run(round_: int, gbit: float, seconds: float) -> dict[str, object]:
        return {"round": round_, "gbit": gbit, "model": "mlp", "nbytes": nbytes,
                "seconds_per_call": seconds}

    first = {"cpu": "test", "rounds": 1,
             "runs": [run(0, 0.0, 0.050), run(0, 10.0, 0.050 + wire / 2)]}
    slower = {"cpu": "test", "rounds": 1,  # the whole round 20 ms slower
              "runs": [run(0, 10.0, 0.070 + wire / 2), run(0, 0.0, 0.070)]}
    both = pool_rounds([first, slower])
    assert both["rounds"] == 2 and sorted({r["round"] for r in both["runs"]}) == [0, 1]
    text = grpc_link_time.report(both)
    row = next(line for line in text.splitlines() if "10 Gbit/s" in line).split("|")
    assert row[-2].strip() == "0.5"  # added / wire, paired: the slow round's drift is out
    assert row[-4].strip() == f"{wire / 2 * 1e3:.1f} to {wire / 2 * 1e3:.1f}"
    assert f"mlp: {wire / 2 * 1e3:.2f} of {wire * 1e3:.2f} ms, 0.50" in text
    with pytest.raises(ValueError, match="different cpus"):
        pool_rounds([first, {**slower, "cpu": "other"}])
