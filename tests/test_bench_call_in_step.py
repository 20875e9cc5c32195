"""bench.call_in_step: what a pair of modes costs beyond its parts."""

from __future__ import annotations

import pytest

from bench.call_in_step import excesses


def test_a_pairs_excess_is_its_median_less_its_parts_medians() -> None:
    """Medians over the rounds, not means: one slow round of a part moves nothing."""
    ms = {"call": [110.0, 104.0, 300.0], "step": [19.0, 18.0, 20.0],
          "step+call": [150.0, 160.0, 155.0], "chain": [20.0, 19.0, 21.0],
          "chain+call": [129.0, 131.0, 400.0]}
    assert excesses(ms) == pytest.approx({"step+call": 155.0 - 110.0 - 19.0,
                                          "chain+call": 131.0 - 110.0 - 20.0})
