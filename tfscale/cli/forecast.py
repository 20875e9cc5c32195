"""``python -m tfscale.forecast``: throughput, efficiency, exchange and time to accuracy at N nodes.

    python -m tfscale.forecast --machine=summit --model=resnet50 --batch_size=256 \\
        --nodes=1,8,64,128,256,512,1024 --json=forecast.json --plot=forecast.png
    python -m tfscale.forecast --machine=minicluster_10gbit --model=mlp --batch_size=64 \\
        --nodes=1,2 --measured=2:1234.5          # forecast against a measured run
    python -m tfscale.forecast --calibrate --model=mlp --batch_size=64 --precision=fp32 \\
        --machine=minicluster_10gbit --out=my_node.json [-- more tfscale.train flags]

Only ``--calibrate`` runs TensorFlow, in child processes of ``tfscale.train``; the forecast
itself is arithmetic over the machine file (see docs/FORECAST.md).
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Any

from absl import app, flags

from tfscale.cli import command, output
from tfscale.cli.command import parse_flags
from tfscale.config.train_config import PRECISIONS
from tfscale.forecast import accuracy, efficiency, machines
from tfscale.forecast.model import ALGORITHMS, TRANSPORTS
from tfscale.forecast.predict import Plan, Row, fastest, forecast
from tfscale.strategies import MULTI_PROCESS_DEFAULT
from tfscale.training.files import write_json_atomic

_MACHINE = flags.DEFINE_string("machine", "summit", "A preset (summit, dgx_a100, "
                               "minicluster_1gbit, minicluster_10gbit, minicluster_25gbit) or "
                               "a machine JSON file.")
_MODEL = flags.DEFINE_string("model", "resnet50", "Model whose figures the machine file holds.")
_BATCH = flags.DEFINE_integer("batch_size", 256, "Batch size per rank (GPU or worker).")
_GLOBAL = flags.DEFINE_integer("global_batch", 0, "Global batch instead of --batch_size: "
                               "divided among the ranks of each node count.")
_NODES = flags.DEFINE_list("nodes", ["1", "8", "64", "128", "256", "512", "1024"], "Node counts.")
_PRECISION = flags.DEFINE_enum("precision", "auto", PRECISIONS, "Compute precision, as in "
                               "tfscale.train; auto: the fastest the machine file records.")
_RANKS = flags.DEFINE_integer("ranks_per_node", 0, "Ranks per node (0: the machine's).")
_EXCHANGE = flags.DEFINE_enum("exchange", "auto", ("auto", *ALGORITHMS),
                              "Pin the all-reduce algorithm (auto: recommend one).")
_FP16 = flags.DEFINE_enum("fp16_allreduce", "auto", ("auto", "on", "off"),
                          "Pin fp16 compression of the gradients (auto: recommend).")
_FUSION = flags.DEFINE_float("fusion_mb", 0, "Pin the fusion buffer in MB (0: recommend).")
_CYCLE = flags.DEFINE_float("cycle_time_ms", 0, "Pin the cycle time in ms (0: recommend).")
_STRATEGY = flags.DEFINE_string(
    "strategy", MULTI_PROCESS_DEFAULT, "Whose transports carry the exchange, for its host time "
    "where ranks share cores (each strategy's class says which: Strategy.host_transports): "
    "horovod and ddl, MPI (the machine file's raw TCP figure); multiworker, tfscale's ring "
    "across nodes (hierarchical) or TensorFlow's gRPC collective (flat), at the file's "
    "exchange.idle_ns_per_byte_by_transport where --calibrate measured them.")
_TRANSPORT = flags.DEFINE_enum(
    "transport", "auto", ("auto", *TRANSPORTS), "How a flat ring's hops between two ranks of "
    "one node travel, for the host time of the exchange where ranks share cores: "
    "shared_memory (Open MPI, NCCL: horovod and ddl) or tcp (Gloo, TensorFlow's gRPC ring: "
    "multiworker), whose in-node hops cost host time like those across nodes; auto: "
    "--strategy's.")
_JSON = flags.DEFINE_string("json", None, "Write the rows to this JSON file.")
_PLOT = flags.DEFINE_string("plot", "", "Draw images/s and efficiency into this PNG file "
                            "(empty or none: no plot).")
_TABLE = flags.DEFINE_string("accuracy_table", str(accuracy.DEFAULT_TABLE),
                             "Epochs-per-global-batch table for time to accuracy (none: "
                             "leave it out).")
_EFFICIENCY = flags.DEFINE_string(
    "efficiency", "", "Statistical-efficiency file: epochs to a target accuracy against the "
    "global batch (python -m bench.statistical_scaling writes one; a shipped name such as "
    "digits works too). Replaces --accuracy_table for the epochs and minutes to the target.")
_MEASURED = flags.DEFINE_list("measured", [], "NODES:IMAGES_PER_SEC of measured or published "
                              "runs: printed with the forecast's error and drawn on the plot.")
_CALIBRATE = flags.DEFINE_boolean("calibrate", False, "Measure this node with tfscale.train and "
                                  "write the model's figures into --out (a copy of --machine).")
_STEPS = flags.DEFINE_integer("calibrate_steps", 20, "Training steps per calibration run.")
_SECONDS = flags.DEFINE_float("calibrate_seconds", 3.0, "Seconds each of --calibrate's exchange "
                              "timings runs (host time idle and busy, tfscale's ring, gRPC; the "
                              "float16 cast at most 2): longer for steadier figures on a noisy "
                              "node.", lower_bound=0.1)
_OUT = flags.DEFINE_string("out", None, "Machine file --calibrate writes.")


def _pinned() -> tuple[tuple[str, Any], ...]:
    pins: list[tuple[str, Any]] = []
    if _EXCHANGE.value != "auto":
        pins.append(("algorithm", _EXCHANGE.value))
    if _FP16.value != "auto":
        pins.append(("fp16", _FP16.value == "on"))
    if _FUSION.value > 0:
        pins.append(("fusion_mb", _FUSION.value))
    if _CYCLE.value > 0:
        pins.append(("cycle_ms", _CYCLE.value))
    return tuple(pins)


def _positive_ints(values: list[str], flag: str) -> list[int]:
    try:
        numbers = [int(v) for v in values]
    except ValueError:
        numbers = []
    if not numbers or min(numbers) < 1:
        raise ValueError(f"--{flag}={','.join(values)}: expected whole numbers >= 1")
    return numbers


def _measured() -> dict[int, float]:
    out = {}
    for item in _MEASURED.value:
        nodes, _, rate = item.partition(":")
        try:
            out[int(nodes)] = float(rate)
        except ValueError:
            raise ValueError(f"--measured={item!r}: expected NODES:IMAGES_PER_SEC") from None
    return out


def _precision(machine: machines.Machine, model: str) -> str:
    if _PRECISION.value != "auto":
        return _PRECISION.value
    rates = machine.model(model).images_per_sec
    return max(rates, key=lambda p: rates[p])


def _rows_for(machine: machines.Machine, precision: str, nodes: list[int]) -> list[Row]:
    plan = Plan(machine, _MODEL.value, precision, _BATCH.value, _RANKS.value, _pinned(),
                "" if _TRANSPORT.value == "auto" else _TRANSPORT.value, _STRATEGY.value)
    if not _GLOBAL.value:
        return forecast(plan, nodes)
    rows = []
    for n in nodes:
        per_rank = _GLOBAL.value // (n * plan.local)
        if per_rank < 1:
            raise ValueError(f"--global_batch={_GLOBAL.value} is smaller than the "
                             f"{n * plan.local} ranks of {n} nodes")
        rows += forecast(dataclasses.replace(plan, batch_size=per_rank), [n])
    return rows


def _table(rows: list[Row], curve: efficiency.EpochsCurve | None,
           table: accuracy.AccuracyTable | None,
           measured: dict[int, float]) -> tuple[str, list[dict[str, Any]]]:
    best = fastest(rows, curve) if curve else None
    header = (f"{'nodes':>6} {'ranks':>6} {'batch':>7} {'compute':>8} {'exch':>7} {'step':>8} "
              f"{'images/s':>11} {'eff':>6}" + (f" {'epochs':>7}" if curve else "")
              + (f" {'top1':>5}" if table else "") + (f" {'min':>8}" if curve else "")
              + (f" {'measured':>11} {'error':>7}" if measured else "")
              + f"  {'dominant; largest loss':<24} recommended")
    lines, records = [header], []
    for r in rows:
        record = r.as_json()
        line = (f"{r.nodes:>6} {r.ranks:>6} {r.global_batch:>7} {r.compute_ms:>6.1f}ms "
                f"{r.exchange_ms:>5.1f}ms {r.step_ms:>6.1f}ms {r.images_per_sec:>11.1f} "
                f"{100 * r.efficiency:>5.1f}%")
        if curve:
            epochs = curve.epochs(r.global_batch)
            minutes = curve.minutes(r.global_batch, r.images_per_sec)
            record.update(epochs=epochs, time_to_accuracy_min=minutes, target=curve.target,
                          fastest=r is best)
            if epochs is None or minutes is None:
                record["accuracy_unknown"] = (table or curve).unknown(r.global_batch)
            elif caution := curve.caution(r.global_batch):
                record["accuracy_caution"] = caution
            line += f" {'-':>7}" if epochs is None else f" {epochs:>7.2f}"
            if table:
                need = table.at(r.global_batch)
                record.update(expected_top1=need and need.top1,
                              optimizer=need and need.optimizer)
                line += f" {'-':>5}" if need is None else f" {need.top1:>5.3f}"
            line += f" {'-':>8}" if minutes is None else f" {minutes:>8.2f}"
        if measured:
            seen = measured.get(r.nodes)
            record.update(measured_images_per_sec=seen, error=None)
            if seen is None:
                line += f" {'-':>11} {'-':>7}"
            else:
                record["error"] = r.images_per_sec / seen - 1
                line += f" {seen:>11.1f} {100 * record['error']:>+6.1f}%"
        line += f"  {r.describe_terms():<24} {r.recommended.describe()}"
        lines.append(line + ("  <- fewest minutes" if r is best else ""))
        records.append(record)
    return "\n".join(lines), records


def _curve() -> tuple[efficiency.EpochsCurve | None, accuracy.AccuracyTable | None, str]:
    """Where epochs to the target come from: --efficiency, else the accuracy table when it is
    for --model; and why there is none, if so."""
    if _EFFICIENCY.value not in ("", "none"):
        curve = efficiency.load(_EFFICIENCY.value)
        if curve.model != _MODEL.value:
            return None, None, (f"(no time to target: {curve.path} was measured with "
                                f"{curve.model!r}, not --model={_MODEL.value})")
        return curve, None, ""
    if _TABLE.value == "none":
        return None, None, ""
    table = accuracy.load_table(_TABLE.value)
    if table.model != _MODEL.value:
        return None, None, f"(no time to accuracy: {table.path} is for {table.model!r})"
    return table.curve(), table, ""


def _best_line(rows: list[Row], records: list[dict[str, Any]],
               curve: efficiency.EpochsCurve) -> str:
    best = fastest(rows, curve)
    if best is None:
        return f"no node count here has a measured global batch in {curve.path.name}"
    known = [r for r, rec in zip(rows, records, strict=True)
             if rec["time_to_accuracy_min"] is not None]
    minutes = curve.minutes(best.global_batch, best.images_per_sec)
    if best is known[-1] and best is not rows[-1]:
        return (f"fewest minutes to {curve.target}: {best.nodes} nodes ({minutes:.2f} min), "
                "the largest node count here whose epochs to the target are known (above: "
                "why the larger ones are not)")
    if best is rows[-1]:
        return (f"fewest minutes to {curve.target}: {best.nodes} nodes ({minutes:.2f} min), "
                "the largest asked for: more nodes may shorten the run further")
    return (f"fewest minutes to {curve.target}: {best.nodes} nodes ({minutes:.2f} min); "
            "more nodes no longer shorten the run")


def _by_reason(records: list[dict[str, Any]], key: str) -> dict[str, str]:
    """The rows' global batches ("128 and 256") by the reason each gives under ``key``."""
    batches: dict[str, list[str]] = {}
    for record in records:
        if record.get(key):
            batches.setdefault(record[key], []).append(f"{record['global_batch']:,}")
    return {why: " and ".join(listed) for why, listed in batches.items()}


def run_forecast() -> int:
    machine = machines.load(_MACHINE.value)
    nodes = _positive_ints(_NODES.value, "nodes")
    precision = _precision(machine, _MODEL.value)
    rows = _rows_for(machine, precision, nodes)
    curve, table, missing = _curve()
    measured = _measured()
    text, records = _table(rows, curve, table, measured)
    print(f"== forecast: {_MODEL.value} on {machine.name} ({machine.path}), {precision}, "
          f"{rows[0].ranks // rows[0].nodes} ranks per node, {_STRATEGY.value} ==")
    print(text)
    what = "accuracy or time to accuracy" if table else "epochs or time to target"
    for why, batches in _by_reason(records, "accuracy_unknown").items():
        print(f"no {what} at global batch {batches}: {why}")
    for why, batches in _by_reason(records, "accuracy_caution").items():
        print(f"caution, epochs at global batch {batches}: {why}")
    if curve:
        print(_best_line(rows, records, curve))
    if missing:
        print(missing)
    if _JSON.value:
        write_json_atomic(_JSON.value, records)
    if _PLOT.value not in ("", "none"):
        from tfscale.forecast.plot import write_png

        path = write_png(rows, _PLOT.value,
                         f"{_MODEL.value} on {machine.name}: batch "
                         + (f"{_GLOBAL.value} global" if _GLOBAL.value else
                            f"{_BATCH.value} per rank") + f", {precision}", measured, curve)
        print(f"plot: {path.resolve()}")
    return 0


def run_calibrate(train_flags: list[str]) -> int:
    from tfscale.forecast import calibrate

    if not _OUT.value:
        raise ValueError("--calibrate needs --out=FILE.json for the machine file it writes")
    precision = "fp32" if _PRECISION.value == "auto" else _PRECISION.value
    entry = calibrate.measure(_MODEL.value, _BATCH.value, precision, _STEPS.value, train_flags,
                              seconds=_SECONDS.value)
    machine = calibrate.write(_MACHINE.value, Path(_OUT.value), _MODEL.value, entry)
    print(f"calibrated {_MODEL.value} ({precision}, batch {_BATCH.value}): "
          f"{entry['step_ms'][precision]:.1f} ms/step, "
          f"{entry['images_per_sec'][precision]:.1f} images/s, "
          f"{entry['gradient_bytes'] / 1e6:.2f} MB of gradients -> {machine.path}")
    print("the exchange's calls across nodes are not timed on one node: on the nodes, run "
          "srun -N2 --ntasks-per-node=L --mpi=pmix python -m tfscale.cli.link_time "
          f"--machine={machine.path} --model={_MODEL.value} --out={machine.path}")
    return 0


def main(argv: list[str]) -> int:
    try:
        if _CALIBRATE.value:
            return run_calibrate(argv[1:])
        if len(argv) > 1:
            raise ValueError(f"unexpected arguments {argv[1:]} (only --calibrate passes "
                             "arguments after -- to tfscale.train)")
        return run_forecast()
    except (ValueError, RuntimeError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


def entry() -> None:
    """The ``tfscale-forecast`` command (and ``python -m tfscale.forecast``)."""
    command.absl_help("tfscale.forecast", __doc__ or "", __name__)
    app.run(output.ends_quietly(main), flags_parser=parse_flags)
