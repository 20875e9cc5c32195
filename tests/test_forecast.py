"""tfscale.forecast: exchange formulas against hand-computed cases, machine files and their
errors, the CLI's JSON rows, and --calibrate writing a machine file. No timing is asserted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tfscale.forecast import accuracy, calibrate, machines
from tfscale.forecast.model import (
    Exchange,
    Link,
    best_exchange,
    flat_allreduce_s,
    hierarchical_allreduce_s,
    negotiation_s,
    overlap_exchange,
    reduce_scatter_s,
    ring_allreduce_s,
)
from tfscale.forecast.predict import Plan, compare_measured, forecast

ROOT = Path(__file__).resolve().parents[1]
MB = 1024 * 1024
GB = Link(bandwidth_GBps=1.0, latency_us=10.0)


# --- exchange formulas ------------------------------------------------------------------------

def test_ring_allreduce_by_hand() -> None:
    # 4 ranks, 1e9 bytes over 1 GB/s and 10 us: 2*3 steps of latency + 2*3/4 of the bytes.
    assert ring_allreduce_s(1e9, 4, GB) == pytest.approx(6 * 10e-6 + 1.5)
    assert ring_allreduce_s(1e9, 1, GB) == 0.0
    assert reduce_scatter_s(1e9, 4, GB) == pytest.approx(3 * 10e-6 + 0.75)


def test_hierarchical_by_hand() -> None:
    intra, inter = Link(10.0, 1.0), Link(1.0, 5.0)
    # Reduce-scatter + all-gather in a node of 4 over 10 GB/s: 2 * (3 us + 3/4 * 4e9 / 1e10);
    # across 2 nodes each rank's 1e9-byte shard, the 4 rings sharing 1 GB/s (0.25 GB/s each):
    # 2 * 5 us + 2 * 1/2 * 1e9 / 0.25e9.
    expected = 2 * (3e-6 + 0.3) + (10e-6 + 4.0)
    assert hierarchical_allreduce_s(4e9, 4, 2, intra, inter) == pytest.approx(expected)


def test_flat_ring_waits_for_the_slowest_hop() -> None:
    intra, inter = Link(10.0, 1.0), Link(1.0, 5.0)
    # 8 ranks: 14 steps at the inter-node latency, 2*7/8 of the bytes at the inter-node rate.
    assert flat_allreduce_s(4e9, 4, 2, intra, inter) == pytest.approx(14 * 5e-6 + 7.0)
    assert flat_allreduce_s(4e9, 4, 1, intra, inter) == ring_allreduce_s(4e9, 4, intra)


def test_hierarchy_trades_latency_steps_for_in_node_bytes() -> None:
    # Small messages over 6 x 512 ranks: 2 x 3071 latency steps against 2 x 5 + 2 x 511.
    intra, inter = Link(50.0, 1.0), Link(25.0, 5.0)
    assert (hierarchical_allreduce_s(1e3, 6, 512, intra, inter)
            < flat_allreduce_s(1e3, 6, 512, intra, inter))
    # Large messages where the node is no faster inside than out: the hierarchy moves the
    # bytes twice (in the node, then across), the flat ring once.
    same = Link(25.0, 1.0)
    assert (flat_allreduce_s(1e9, 6, 64, same, same)
            < hierarchical_allreduce_s(1e9, 6, 64, same, same))


def test_negotiation_is_a_tree_over_all_ranks() -> None:
    assert negotiation_s(1, GB) == 0.0
    assert negotiation_s(1024, GB) == pytest.approx(2 * 10 * 10e-6)


def _cost_per_10mb(nbytes: float) -> float:
    return 0.01 * nbytes / (10 * MB)


def test_overlap_hides_all_but_the_last_cycle() -> None:
    # 100 MB ready evenly over a 1 s backward pass, a cycle of 100 ms: ten 10 MB messages of
    # 10 ms each; only the last (sent at 1.0 s) runs past the backward pass.
    result = overlap_exchange(100 * MB, 1.0, Exchange(cycle_ms=100, fusion_mb=64),
                              _cost_per_10mb)
    assert result.messages == 10
    assert result.exposed_s == pytest.approx(0.01)
    assert result.busy_s == pytest.approx(0.1)


def test_without_overlap_everything_is_exposed_in_fusion_sized_messages() -> None:
    exchange = Exchange(cycle_ms=100, fusion_mb=16)
    result = overlap_exchange(100 * MB, 1.0, exchange, _cost_per_10mb, negotiate_s=0.005,
                              overlap=False)
    assert result.messages == 7  # 6 x 16 MB + 4 MB
    assert result.exposed_s == pytest.approx(0.1 + 0.005)


def test_a_long_exchange_is_exposed_beyond_the_backward_pass() -> None:
    # 100 MB at 1 s per 10 MB cannot hide behind a 1 s backward pass: 10 s of exchange, the
    # first message leaving at 0.1 s.
    result = overlap_exchange(100 * MB, 1.0, Exchange(cycle_ms=100, fusion_mb=64),
                              lambda b: 100 * _cost_per_10mb(b))
    assert result.exposed_s == pytest.approx(0.1 + 10.0 - 1.0)


def test_fp16_halves_the_bytes_and_is_recommended_only_when_it_pays() -> None:
    intra, inter = Link(10.0, 0.0), Link(1.0, 0.0)
    exact, half = Exchange(fp16=False), Exchange(fp16=True)
    assert half.allreduce(2, 2, intra, inter)(1e9) == pytest.approx(
        exact.allreduce(2, 2, intra, inter)(0.5e9))
    steps = {exact: 1.0, half: 0.995}
    assert best_exchange(steps.__getitem__, [exact, half])[0] == exact
    steps[half] = 0.9
    assert best_exchange(steps.__getitem__, [exact, half])[0] == half


# --- machine files ----------------------------------------------------------------------------

def test_every_preset_loads_and_cites_its_links() -> None:
    assert {"summit", "dgx_a100", "minicluster_1gbit", "minicluster_10gbit",
            "minicluster_25gbit"} <= set(machines.presets())
    for name in machines.presets():
        machine = machines.load(name)
        assert machine.raw["intra_node"]["source"] and machine.raw["inter_node"]["source"]
        assert all(f.source for f in machine.models.values())
    summit = machines.load("summit")
    assert (summit.ranks_per_node, summit.inter.bandwidth_GBps) == (6, 25.0)


def _write(tmp_path: Path, doc: object) -> str:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return str(path)


def _summit() -> dict:
    return json.loads((machines.PRESET_DIR / "summit.json").read_text())


@pytest.mark.parametrize(("edit", "message"), [
    (lambda d: d.pop("inter_node"), "field 'inter_node' is missing"),
    (lambda d: d["inter_node"].update(bandwidth_GBps=-1),
     "field 'inter_node.bandwidth_GBps' must be a number > 0, got -1"),
    (lambda d: d["intra_node"].pop("source"), "field 'intra_node.source' is missing"),
    (lambda d: d["node"].update(ranks=0), "field 'node.ranks' must be a whole number >= 1"),
    (lambda d: d["models"]["resnet50"]["images_per_sec"].update(fp8=1.0),
     "has unknown precision 'fp8'"),
    (lambda d: d["models"]["resnet50"].update(backward_fraction=1.5),
     "field 'models.resnet50.backward_fraction' must be a number > 0 and <= 1"),
    (lambda d: d["exchange"].update(overlap="yes"), "field 'exchange.overlap' must be true"),
], ids=["missing-section", "negative-bandwidth", "missing-source", "zero-ranks",
        "unknown-precision", "backward-fraction", "overlap-not-bool"])
def test_bad_machine_files_name_the_file_and_field(tmp_path: Path, edit, message: str) -> None:
    doc = _summit()
    edit(doc)
    path = _write(tmp_path, doc)
    with pytest.raises(ValueError) as err:
        machines.load(path)
    assert str(err.value).startswith(path) and message in str(err.value)


def test_not_json_and_unknown_names(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="bad.json: not valid JSON"):
        machines.load(_write(tmp_path, "{nope"))
    with pytest.raises(ValueError, match="unknown machine; presets: dgx_a100, minicluster_"):
        machines.load("nope")
    with pytest.raises(ValueError, match="no compute rate for --precision=fp32 of model "
                                         "'resnet50'; it has: mixed_float16"):
        machines.load("summit").figures("resnet50", "fp32")
    with pytest.raises(ValueError, match="no figures for model 'vgg16'"):
        machines.load("summit").figures("vgg16", "fp32")


# --- forecasts --------------------------------------------------------------------------------

def test_one_node_reproduces_the_figure_it_was_given() -> None:
    plan = Plan(machines.load("summit"), "resnet50", "mixed_float16", 256)
    one, many = forecast(plan, [1, 1024])
    assert one.images_per_sec == pytest.approx(5320, rel=1e-3)
    assert one.efficiency == 1.0 and 0 < many.efficiency <= 1.0
    assert many.step_ms == pytest.approx(many.compute_ms + many.exchange_ms)


def test_slow_links_lose_efficiency_and_compare_measured_reports_the_error() -> None:
    rows = {}
    for gbit in (1, 25):
        plan = Plan(machines.load(f"minicluster_{gbit}gbit"), "mlp", "fp32", 64)
        rows[gbit] = forecast(plan, [2])[0]
    assert rows[1].efficiency < rows[25].efficiency
    plan = Plan(machines.load("minicluster_1gbit"), "mlp", "fp32", 64)
    report = compare_measured(plan, 2, rows[1].images_per_sec / 1.25)
    assert report["error"] == pytest.approx(0.25)


def test_accuracy_table_interpolates_and_rejects_bad_rows(tmp_path: Path) -> None:
    table = accuracy.load_table()
    middle = table.at(16384)
    assert middle.top1 == pytest.approx((0.763 + 0.749) / 2)
    assert middle.optimizer == "LARS" and table.unknown(16384) == ""
    assert table.at(4096).optimizer.startswith("SGD")
    assert table.minutes(8192, 1281167 / 60) == pytest.approx(90)
    # Outside the published rows nothing is known: no number, and a reason in words.
    for batch, side in ((65536, "above 32,768, its largest"), (128, "below 256, its smallest")):
        assert table.at(batch) is None and table.minutes(batch, 1e6) is None
        assert f"no published run at a global batch {side}" in table.unknown(batch)
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"model": "m", "train_images": 10,
                                "rows": [{"global_batch": 8, "epochs": 0, "top1": 0.5,
                                          "source": "x"}]}))
    with pytest.raises(ValueError, match=r"t.json: field 'rows\[0\]' needs"):
        accuracy.load_table(path)


def test_cli_writes_json_rows_and_a_plot_without_tensorflow(tmp_path: Path) -> None:
    out, png = tmp_path / "rows.json", tmp_path / "plot.png"
    code = ("import runpy, sys; sys.argv = ['tfscale.forecast'] + sys.argv[1:]\n"
            "try:\n    runpy.run_module('tfscale.forecast', run_name='__main__')\n"
            "except SystemExit as e:\n    assert not e.code, e.code\n"
            "print('loaded', [m for m in ('tensorflow', 'keras') if m in sys.modules])")
    proc = subprocess.run(
        [sys.executable, "-c", code, "--machine=summit", "--nodes=1,8,1024", f"--json={out}",
         f"--plot={png}", "--measured=8:41746"], cwd=ROOT, capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().endswith("loaded []"), proc.stdout
    rows = json.loads(out.read_text())
    assert [r["nodes"] for r in rows] == [1, 8, 1024]
    for row in rows:
        assert {"nodes", "images_per_sec", "efficiency", "step_ms", "exchange_ms",
                "recommended", "time_to_accuracy_min"} <= set(row)
        assert isinstance(row["recommended"], str) and "fusion" in row["recommended"]
    assert rows[1]["error"] == pytest.approx(rows[1]["images_per_sec"] / 41746 - 1)
    assert png.stat().st_size > 10_000
    assert f"plot: {png}" in proc.stdout
    # 1024 nodes x 6 GPUs x 256 is far beyond the table's largest batch: no accuracy, said why.
    assert rows[1]["expected_top1"] == pytest.approx(0.759, abs=1e-3)
    assert rows[2]["global_batch"] == 1572864
    assert rows[2]["expected_top1"] is None and rows[2]["time_to_accuracy_min"] is None
    assert "above 32,768" in rows[2]["accuracy_unknown"]
    last = next(line for line in proc.stdout.splitlines() if line.lstrip().startswith("1024 "))
    assert "0.749" not in last and "*" not in last
    assert ("no accuracy or time to accuracy at global batch 1,572,864: the accuracy table "
            "(accuracy_resnet50_imagenet.json) has no published run") in proc.stdout


def test_cli_draws_no_plot_unless_asked(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "tfscale.forecast", "--machine=summit",
                           "--nodes=1,8"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 0, proc.stderr
    assert list(tmp_path.iterdir()) == [] and "plot" not in proc.stdout


def test_cli_usage_errors(tmp_path: Path) -> None:
    for args, message in ((["--machine=nope"], "unknown machine"),
                          (["--precision=fp32"], "no compute rate for --precision=fp32"),
                          (["--nodes=0"], "--nodes=0: expected whole numbers >= 1")):
        proc = subprocess.run([sys.executable, "-m", "tfscale.forecast", "--plot=none", *args],
                              cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 2 and message in proc.stderr, proc.stderr


# --- calibration ------------------------------------------------------------------------------

@pytest.mark.slow
def test_calibrate_on_mlp_writes_a_valid_machine_file(tmp_path: Path) -> None:
    out = tmp_path / "node.json"
    proc = subprocess.run(
        [sys.executable, "-m", "tfscale.forecast", "--calibrate", "--model=mlp",
         "--batch_size=16", "--precision=fp32", "--calibrate_steps=4",
         "--machine=minicluster_10gbit", f"--out={out}", "--", "--image_size=8",
         "--num_classes=10"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    machine = machines.load(str(out))
    figures, rate = machine.figures("mlp", "fp32")
    # Flatten 8x8x3 -> Dense 512 -> Dense 512 -> Dense 10, float32 weights and biases.
    assert figures.gradient_bytes == 4 * ((192 + 1) * 512 + (512 + 1) * 512 + (512 + 1) * 10)
    assert figures.batch_size == 16 and rate > 0
    assert "tfscale.train" in figures.source and calibrate.cpu_name() in figures.source
    assert machine.inter == machines.load("minicluster_10gbit").inter
    assert forecast(Plan(machine, "mlp", "fp32", 16), [2])[0].images_per_sec > 0
