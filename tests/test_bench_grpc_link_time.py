"""bench.grpc_link_time's arithmetic: the time a shaped link adds to gRPC's flat ring, set
against the wire's own time at the link's rate."""

from __future__ import annotations

import pytest

from bench import grpc_link_time


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
