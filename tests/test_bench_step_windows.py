"""bench.step_windows sets the tracer's record of each core against the ranks' step stamps."""

from __future__ import annotations

import io
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.step_windows import (
    CoreTime,
    analyse,
    group_of,
    load_stamps,
    report,
    shared_core,
    step_windows,
)
from tests.conftest import TINY, read_results
from tfscale.scripts.launcher import supervise, tf_config_envs


def _line(comm: str, pid: int, tgid: int | None, cpu: int, seconds: float, event: str,
          fields: str) -> str:
    group = f"{tgid:7d}" if tgid is not None else "-------"
    return f"{comm:>16}-{pid:<7d} ({group}) [{cpu:03d}] d..2. {seconds:.6f}: {event}: {fields}"


def _switch(cpu: int, seconds: float, prev: tuple[str, int, int | None],
            nxt: tuple[str, int]) -> str:
    comm, pid, tgid = prev
    return _line(comm, pid, tgid, cpu, seconds, "sched_switch",
                 f"prev_comm={comm} prev_pid={pid} prev_prio=120 prev_state=S ==> "
                 f"next_comm={nxt[0]} next_pid={nxt[1]} next_prio=120")


IDLE = ("swapper/0", 0, None)
A_MAIN, A_COMPUTE = ("train.py", 100, 100), ("tf_Compute", 101, 100)
B_COMPUTE, B_COLLECTIVE = ("tf_Compute", 201, 200), ("collective_ops", 202, 200)

# Core 0 carries ranks A (pid 100) and B (pid 200); core 1 a kernel thread.
TRACE = "\n".join([
    "# tracer: nop",
    _switch(0, 10.000, IDLE, A_COMPUTE[:2]),
    _line(*A_COMPUTE, 0, 10.010, "softirq_entry", "vec=3 [action=NET_RX]"),
    _line(*A_COMPUTE, 0, 10.012, "softirq_exit", "vec=3 [action=NET_RX]"),
    _switch(0, 10.020, A_COMPUTE, B_COLLECTIVE[:2]),
    _switch(0, 10.030, B_COLLECTIVE, ("swapper/0", 0)),
    _switch(0, 10.040, IDLE, A_MAIN[:2]),
    _switch(0, 10.050, A_MAIN, B_COMPUTE[:2]),
    _line(*B_COMPUTE, 0, 10.055, "softirq_entry", "vec=1 [action=TIMER]"),
    _line(*B_COMPUTE, 0, 10.056, "softirq_exit", "vec=1 [action=TIMER]"),
    _switch(0, 10.070, B_COMPUTE, ("swapper/0", 0)),
    _switch(1, 10.000, ("swapper/1", 0, None), ("kworker/1:2", 300)),
    _switch(1, 10.050, ("kworker/1:2", 300, 300), ("swapper/1", 0)),
])


def _stamps(tmp_path: Path, pid: int, rows: list[list[float]]) -> None:
    lines = [" ".join(str(round(t * 1e6)) for t in row) for row in rows]
    (tmp_path / f"node1_{pid}.txt").write_text("\n".join(lines) + "\n")


def test_each_window_gets_what_ran_on_the_ranks_core_by_group(tmp_path: Path) -> None:
    # One step: compute to 10.015, exchange to 10.035, update to 10.045, next step at 10.050.
    _stamps(tmp_path, 100, [[10.000, 10.015, 10.035, 10.045], [10.050, 10.06, 10.065, 10.07]])
    _stamps(tmp_path, 200, [[10.000, 10.015, 10.035, 10.045], [10.050, 10.06, 10.065, 10.07]])
    ranks = analyse(TRACE, load_stamps(tmp_path, 0.0), skip=0)["ranks"]

    a = ranks["node1_100"]
    assert a["cpu"] == 0 and a["step_ms"] == pytest.approx(50.0)
    # The softirq takes its 2 ms out of the thread it interrupted.
    assert a["compute"]["ms"] == pytest.approx(15.0)
    assert a["compute"]["groups"] == pytest.approx({"self compute threads": 13.0,
                                                    "softirq NET_RX": 2.0})
    assert a["exchange"]["groups"] == pytest.approx({"self compute threads": 5.0,
                                                     "mate exchange threads": 10.0,
                                                     "idle": 5.0})
    assert a["update"]["groups"] == pytest.approx({"idle": 5.0, "self other threads": 5.0})
    assert a["between"]["groups"] == pytest.approx({"self other threads": 5.0})
    # The same core seen from B: A is its mate.
    b = ranks["node1_200"]
    assert b["compute"]["groups"] == pytest.approx({"mate compute threads": 13.0,
                                                    "softirq NET_RX": 2.0})
    assert b["exchange"]["groups"]["self exchange threads"] == pytest.approx(10.0)


def test_a_step_without_exchange_stamps_has_two_windows(tmp_path: Path) -> None:
    _stamps(tmp_path, 100, [[10.000, 10.045], [10.050, 10.07]])
    ranks = analyse(TRACE, load_stamps(tmp_path, 0.0), skip=0)["ranks"]
    assert set(ranks["node1_100"]) == {"cpu", "step_ms", "step", "between"}
    assert ranks["node1_100"]["step"]["ms"] == pytest.approx(45.0)


def test_missing_empty_or_mixed_stamps_and_too_few_steps_are_refused(tmp_path: Path) -> None:
    (tmp_path / "node1_100.txt").write_text("1 2 3 4\n5 6\n")
    with pytest.raises(ValueError, match="node1_100.txt: steps with \\[2, 4\\] stamps"):
        load_stamps(tmp_path, 0.0)
    (tmp_path / "node1_100.txt").write_text("")
    with pytest.raises(ValueError, match="node1_100.txt: no steps stamped"):
        load_stamps(tmp_path, 0.0)
    (tmp_path / "node1_100.txt").unlink()
    with pytest.raises(ValueError, match="no rank wrote its stamps"):
        load_stamps(tmp_path, 0.0)
    (tmp_path / "node1_100.txt").write_text("1 2 3 4\n5 6 7 8\n")
    with pytest.raises(ValueError, match="2 steps stamped; more than 2"):
        analyse(TRACE, load_stamps(tmp_path, 0.0), skip=1)


def test_a_shared_core_counts_the_union_of_its_ranks_exchanges_and_the_quiet_rest() -> None:
    # Every 100 ms step: rank 1 exchanges 40-60 ms into it, rank 2 50-70; the core runs rank
    # 1's compute threads, then rank 2's collective threads 50-75, then idles 75-80.
    times, labels = [], []
    for step in range(4):
        t = step * 0.1
        times += [t, t + 0.050, t + 0.075, t + 0.080]
        labels += ["1|tf_Compute", "2|collective_ops", "idle", "1|train.py"]
    core = CoreTime(np.array(times), labels)
    starts = np.arange(4) * 0.1
    stamps = {("n", 1): np.stack([starts, starts + 0.04, starts + 0.06, starts + 0.065], 1),
              ("n", 2): np.stack([starts, starts + 0.05, starts + 0.07, starts + 0.075], 1)}
    found = shared_core(core, stamps, skip=0)
    assert found["exchange_ms"] == pytest.approx(30.0)  # 40-70 ms: the union, not 20
    # Quiet 70 ms a step: 70-75 collective threads, 75-80 idle, 80-100 Python, 0-40 compute.
    assert found["quiet"]["ms"] == pytest.approx(70.0)
    assert found["quiet"]["groups"] == pytest.approx({
        "exchange threads": 5.0, "idle": 5.0, "other threads": 20.0, "compute threads": 40.0})


def test_groups_name_the_rank_its_mate_softirqs_and_other_processes() -> None:
    assert group_of("100|tf_Compute", 100, {200}) == "self compute threads"
    assert group_of("200|event_engine", 100, {200}) == "mate exchange threads"
    assert group_of("200|grpc_global_timer", 100, {200}) == "mate exchange threads"
    assert group_of("300|kworker/0:", 100, {200}) == "other tasks"
    assert group_of("softirq HRTIMER", 100, set()) == "softirq HRTIMER"
    assert group_of("softirq RCU", 100, set()) == "softirq other"


def test_the_report_sets_each_two_node_rest_against_its_rounds_one_node_run() -> None:
    def run(layout: str, compute_ms: float, exchange_threads_ms: float) -> dict:
        window = {"ms": compute_ms + exchange_threads_ms,
                  "groups": {"self compute threads": compute_ms,
                             "mate exchange threads": exchange_threads_ms}}
        rank = {"cpu": 0, "step_ms": 50.0, "compute": window,
                "exchange": {"ms": 5.0, "groups": {"idle": 5.0}},
                "update": {"ms": 1.0, "groups": {"self compute threads": 1.0}},
                "between": {"ms": 2.0, "groups": {"self other threads": 2.0}}}
        return {"round": 0, "layout": layout, "images_per_sec": 1000.0,
                "exchange_share": 0.1, "ranks": {"node1_1": rank}}

    result = {"model": "mlp", "gbit": 25.0, "cpu": "EPYC", "when": "now", "skip": 200,
              "runs": [run("1x2 multiworker", 30.0, 0.0), run("2x2 multiworker flat", 33.0, 2.5)]}
    text = report(result)
    assert ("- round 0, 2x2 multiworker flat against 1x2 multiworker: ms +5.50, "
            "compute threads +3.00, exchange threads +2.50") in text
    assert "| 0 | 2x2 multiworker flat | 1000 | compute | 35.50 |" in text


def test_the_kept_set_reports_the_figures_docs_forecast_gives() -> None:
    import json

    kept = Path(__file__).resolve().parents[1] / "docs" / "forecast" / (
        "step_windows_2026-12-07_zen3_mlp_25gbit.json")
    text = report(json.loads(kept.read_text()))
    assert ("- round 0, 2x2 multiworker flat: exchange on the core 86.6 (a rank's own 77.7), "
            "quiet 43.1; quiet against 1x2 multiworker: ms +10.04, compute threads +7.07, "
            "exchange threads +1.39") in text
    assert "- round 1, 2x2 multiworker hierarchical: exchange on the core 26.2" in text
    resnet50 = json.loads(kept.with_name("step_windows_2026-12-07_zen3_resnet50_25gbit.json")
                          .read_text())
    assert ("- round 1, 2x2 multiworker hierarchical: exchange on the core 534.6 (a rank's own "
            "513.7), quiet 5116.6; quiet against 1x2 multiworker: ms +644.77, compute threads "
            "+582.18") in report(resnet50)
    zen4 = json.loads(kept.with_name("step_windows_2026-12-07_zen4_mlp_25gbit.json").read_text())
    assert ("- round 0, 2x2 multiworker flat: exchange on the core 60.8 (a rank's own 56.1), "
            "quiet 19.3; quiet against 1x2 multiworker: ms +0.67, compute threads -0.05") \
        in report(zen4)


def test_the_runs_ranks_run_the_stamped_train_in_place_of_tfscale_train() -> None:
    from bench.shaped_links import ACROSS, _train_command

    layout = next(layout for layout in ACROSS if layout.name == "2x2 multiworker flat")
    entry = ("-m", "bench.step_windows_train", "--stamps_dir=/tmp/s")
    command = _train_command("mlp", layout, ["-N2"], Path("d"), entry=entry)
    assert "tfscale.train" not in command
    at = command.index("bench.step_windows_train")
    assert command[at - 1:at + 3] == ["-m", "bench.step_windows_train", "--stamps_dir=/tmp/s",
                                      "--model=mlp"]


@pytest.mark.slow
def test_two_workers_stamp_each_step_in_the_order_of_its_windows(tmp_path: Path) -> None:
    """bench.step_windows_train under two real TF_CONFIG workers (multiworker, whose exchange
    clock runs): each rank writes one line per step, four stamps in order (start, last
    gradient, last reduced gradient, end of the update), the next step starting after the
    last ended, so that bench.step_windows finds its four windows in every step."""
    stamps, model_dir = tmp_path / "stamps", tmp_path / "run"
    log = io.StringIO()
    steps = 12
    code = supervise([sys.executable, "-m", "bench.step_windows_train",
                      f"--stamps_dir={stamps}", *TINY, "--strategy=multiworker",
                      "--num_processes=2", f"--steps={steps}", f"--model_dir={model_dir}"],
                     tf_config_envs(2), out=log)
    assert code == 0, log.getvalue()[-3000:]
    ranks = load_stamps(stamps, 0.0)
    assert len(ranks) == 2
    for rows in ranks.values():
        assert rows.shape == (steps, 4)
        assert np.all(np.diff(rows, axis=1) >= 0), rows  # start <= grads <= reduced <= end
        assert np.all(rows[1:, 0] >= rows[:-1, 3])  # a step starts after the last one ended
        windows = step_windows(rows, skip=2)
        assert set(windows) == {"compute", "exchange", "update", "between"}
        assert all(np.all(ends >= starts) for starts, ends in windows.values())
    assert read_results(model_dir)["steps"] == steps
