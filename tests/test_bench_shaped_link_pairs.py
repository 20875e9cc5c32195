"""bench.shaped_link_pairs' arithmetic: each round's slower link set against its faster one,
and the exchange's share read from the progress lines."""

from __future__ import annotations

import pytest

from bench import shaped_link_pairs
from bench.common import pool_rounds


def test_the_exchange_share_is_read_from_each_progress_line() -> None:
    out = ("step 200/1000  loss 0.1  3000.0 images/s (exchange 69%)  elapsed 0:00:14\n"
           "step 400/1000  loss 0.1  3100.5 images/s (exchange 71%)  elapsed 0:00:28\n"
           "exchange    inside a node: gRPC (auto collectives)\n")
    assert shaped_link_pairs.shares(out) == [0.69, 0.71]


def test_each_round_sets_the_slower_link_against_the_faster_and_results_pool() -> None:
    def result(rates: list[tuple[float, float]], **extra: object) -> dict[str, object]:
        runs = []
        for round_, (slow, fast) in enumerate(rates):
            runs += [{"round": round_, "gbit": 25.0, "steady_images_per_sec": fast,
                      "exchange_shares": [0.6, 0.7]},
                     {"round": round_, "gbit": 10.0, "steady_images_per_sec": slow,
                      "exchange_shares": [0.8]}]
        return {"cpu": "test", "rounds": len(rates), "model": "mlp",
                "layout": "2x2 multiworker flat", "links": [10.0, 25.0], "runs": runs, **extra}

    both = pool_rounds([result([(900.0, 1000.0)]),
                        result([(1000.0, 1000.0), (3300.0, 3000.0)])], shaped_link_pairs.SAME)
    assert both["rounds"] == 3
    text = shaped_link_pairs.report(both)
    rows = [line.split("|") for line in text.splitlines() if line.startswith("| ")][1:]
    assert [row[4].strip() for row in rows] == ["0.9", "1", "1.1"]
    assert [(row[5].strip(), row[6].strip()) for row in rows] == [("0.8", "0.65")] * 3
    assert "median 1.000, mean 1.000 over 3 round(s)" in text
    with pytest.raises(ValueError, match="different models"):
        pool_rounds([result([(1.0, 1.0)]), result([(1.0, 1.0)], model="resnet50")],
                    shaped_link_pairs.SAME)
