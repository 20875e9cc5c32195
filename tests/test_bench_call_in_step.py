"""bench.call_in_step: what a pair of modes costs beyond its parts."""

from __future__ import annotations

import os

import pytest

from bench.call_in_step import core_rows, excesses
from bench.common import core_times
from bench.shaped_links import launcher, rank0_text


def test_a_pairs_excess_is_its_median_less_its_parts_medians() -> None:
    """Medians over the rounds, not means: one slow round of a part moves nothing."""
    ms = {"call": [110.0, 104.0, 300.0], "step": [19.0, 18.0, 20.0],
          "step+call": [150.0, 160.0, 155.0], "chain": [20.0, 19.0, 21.0],
          "chain+call": [129.0, 131.0, 400.0]}
    assert excesses(ms) == pytest.approx({"step+call": 155.0 - 110.0 - 19.0,
                                          "chain+call": 131.0 - 110.0 - 20.0})


def test_core_times_sums_the_ranks_cores_columns_from_proc_stat() -> None:
    """user, system, idle and softirq of the named CPUs only, in seconds (USER_HZ ticks)."""
    tick = os.sysconf("SC_CLK_TCK")
    stat = ("cpu  900 0 900 900 0 0 900 0 0 0\n"
            f"cpu0 {tick} 7 {2 * tick} {3 * tick} 5 6 {4 * tick} 8 0 0\n"
            "cpu1 999 0 999 999 0 0 999 0 0 0\n"
            "intr 12345\n")
    assert core_times(stat, {0}) == pytest.approx(
        {"user": 1.0, "system": 2.0, "idle": 3.0, "softirq": 4.0})
    assert core_times(stat, {5}) == dict.fromkeys(("user", "system", "idle", "softirq"), 0.0)


def test_core_rows_take_each_fields_median_and_the_busy_share() -> None:
    rows = core_rows({"call": [{"user": 30.0, "system": 70.0, "softirq": 3.0, "idle": 1.0},
                               {"user": 32.0, "system": 80.0, "softirq": 3.0, "idle": 500.0},
                               {"user": 31.0, "system": 75.0, "softirq": 4.0, "idle": 2.0}]})
    assert rows == [{"mode": "call", "user": 31.0, "system": 75.0, "softirq": 3.0,
                     "idle": 2.0, "busy": "98%"}]


@pytest.mark.parametrize("stdout", [
    # srun: the ranks' lines as they are, rank 0's JSON last
    'starting\n{"ms": {"call": [1.0]}}\n',
    # horovodrun: every line prefixed with its rank; other ranks may print after rank 0
    '[1]<stdout>:starting\n[0]<stdout>:{"ms": {"call": [1.0]}}\n[1]<stdout>:done\n'])
def test_rank0_text_keeps_rank_0s_lines_under_either_launcher(stdout: str) -> None:
    assert rank0_text(stdout).splitlines()[-1] == '{"ms": {"call": [1.0]}}'


def test_launcher_starts_gloo_ranks_with_horovodrun_from_the_first_node() -> None:
    gloo = launcher("gloo", 2)
    assert gloo[gloo.index("horovodrun"):] == [
        "horovodrun", "--gloo", "-np", "4", "-H", "node1:2,node2:2", "--network-interface",
        "eth0"]
    assert gloo[gloo.index("exec"):gloo.index("horovodrun")] == ["exec", "--on", "node1"]
    srun = launcher("mpi", 1, ("-N1", "-w", "node2"), mpi=False)
    assert srun[srun.index("srun"):] == ["srun", "-N1", "-w", "node2", "--ntasks-per-node=1",
                                         "--kill-on-bad-exit=1"]
    with pytest.raises(ValueError, match="both nodes"):
        launcher("gloo", 2, ("-N1", "-w", "node1"))
    with pytest.raises(ValueError, match="'mpi' or 'gloo'"):
        launcher("nccl", 2)
