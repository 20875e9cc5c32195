"""Sweep ``tfscale.train`` flags over a grid; one results table and scaling plots.

    python -m tfscale.sweep --out runs/sweep \\
        --grid batch_size=16,32 --grid strategy=horovod,multiworker --grid num_processes=1,2 \\
        -- --model=resnet50 --steps=10

Every grid point runs as its own ``python -m tfscale.train`` job with its own ``--model_dir``
(``OUT/points/<point>``). A point whose results.json exists is finished and skipped when the
sweep is run again; a point that fails is recorded with its exit code and error line, and the
sweep goes on. The table (``sweep.csv``, ``sweep.json``, ``sweep.md``) and plots
(``throughput.png``, ``scaling.png``) are rewritten after every point. ``--dry_run`` checks every
point's flags as ``tfscale.train`` would (plugins included) and prints its command, running
nothing.

When the reader of its output goes away (``| head``), the sweep goes on and appends its lines
to ``OUT/sweep.log`` from there (:mod:`tfscale.cli.output`); ``--dry_run`` and ``--help`` stop
quietly with exit code 0.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from absl import app, flags

from tfscale.cli import command, output, sweep_report
from tfscale.cli.command import parse_flags
from tfscale.training.durations import clock

_GRID = flags.DEFINE_multi_string(
    "grid", [], "NAME=V1,V2,...: a tfscale.train flag and its values (repeat for more axes).")
_OUT = flags.DEFINE_string("out", "runs/sweep", "Directory for the points, table and plots.")
_TIMEOUT = flags.DEFINE_integer("timeout_s", 3600, "Time limit of one point, in seconds.")
_DRY_RUN = flags.DEFINE_boolean("dry_run", False, "Check every point's flags and print its "
                                "command; run nothing (exit code 2 if a point would be refused).")


@dataclasses.dataclass(frozen=True)
class Point:
    """One grid point: the flag values that differ between points."""

    values: tuple[tuple[str, str], ...]

    @property
    def name(self) -> str:
        """A file-system-safe, stable name for the point's directory (``base`` for the one point
        of a sweep without axes: the base flags alone)."""
        text = "_".join(f"{k}-{v}" for k, v in self.values)
        return re.sub(r"[^A-Za-z0-9._-]+", "-", text) or "base"

    def flags(self) -> list[str]:
        return [f"--{k}={v}" for k, v in self.values]


def parse_grid(specs: Sequence[str]) -> list[Point]:
    """The cross product of ``NAME=V1,V2`` axes, in the order given.

    Raises:
        ValueError: for a malformed axis, a repeated flag, or a flag tfscale.train lacks.
    """
    from tfscale.config.train_config import config_names

    known = set(config_names())
    axes: list[tuple[str, list[str]]] = []
    for spec in specs:
        name, sep, values = spec.partition("=")
        name = name.strip().lstrip("-")
        options = [v.strip() for v in values.split(",") if v.strip()]
        if not sep or not options:
            raise ValueError(f"--grid={spec!r}: expected NAME=V1,V2,... e.g. batch_size=16,32")
        if name not in known:
            raise ValueError(f"--grid={spec!r}: tfscale.train has no flag --{name}")
        if name in dict(axes):
            raise ValueError(f"--grid: flag --{name} is given twice")
        axes.append((name, options))
    names = [n for n, _ in axes]
    return [Point(tuple(zip(names, combo, strict=True)))
            for combo in itertools.product(*(opts for _, opts in axes))]


def train_command(point: Point, base: Sequence[str], model_dir: Path) -> list[str]:
    """The ``tfscale.train`` command line of one point."""
    return [sys.executable, "-m", "tfscale.train", *base, *point.flags(),
            f"--model_dir={model_dir}"]


def check_point(point: Point, base: Sequence[str]) -> str:
    """Why ``tfscale.train`` would refuse the point's flags before training, or ``""``."""
    from tfscale.cli.flags import config_from_args
    from tfscale.cli.plugins import validate_names

    try:
        validate_names(config_from_args((*base, *point.flags())))
    except ValueError as err:
        return str(err)
    return ""


def run_point(point: Point, base: Sequence[str], out: Path, timeout_s: int) -> dict[str, Any]:
    """Runs (or, if finished before, reads) one point; returns its table row."""
    model_dir = out / "points" / point.name
    row: dict[str, Any] = dict(point.values)
    results_path = model_dir / "results.json"
    if not results_path.exists():
        # A half-finished point would resume and report the throughput of a partial run.
        shutil.rmtree(model_dir, ignore_errors=True)
        model_dir.mkdir(parents=True)
        command = train_command(point, base, model_dir)
        start = time.monotonic()
        try:
            proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout_s)
            code, err = proc.returncode, proc.stderr
            (model_dir / "output.log").write_text(proc.stdout + proc.stderr)
        except subprocess.TimeoutExpired:
            code, err = 124, f"error: timed out after {timeout_s}s"
        row["wall_s"] = round(time.monotonic() - start, 1)
        if code != 0:
            lines = [ln for ln in err.strip().splitlines() if ln.strip()]
            errors = [ln for ln in lines if ln.startswith("error:")]
            row.update(status="failed", exit_code=code,
                       error=(errors or lines or [f"exit code {code}"])[-1][:300])
            return row
    results = json.loads(results_path.read_text())
    row.update(status="ok", **{k: results[k] for k in (*sweep_report.DESCRIPTION,
                                                      *sweep_report.RESULT_COLUMNS)
                               if k in results})
    return row


def describe_device() -> str:
    """The device the points run on, for the plots' titles: the GPUs ``nvidia-smi`` lists
    (``GPU: 2 x NVIDIA H100 80GB HBM3``), else the CPU's model and cores."""
    from tfscale.training.precision import cpu_info

    try:
        listed = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.split("\n")
    except (OSError, subprocess.TimeoutExpired):
        listed = []
    gpus = [name.strip() for name in listed if name.strip()]
    if gpus:
        return "GPU: " + ", ".join(f"{gpus.count(n)} x {n}" for n in dict.fromkeys(gpus))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"CPU: {cpu_info()[0]}, {cores} cores"


def sweep(points: Sequence[Point], base: Sequence[str], out: Path,
          timeout_s: int = 3600) -> list[dict[str, Any]]:
    """Runs every point in order, printing a line as each starts and ends, and rewriting the
    table and plots after each; prints the table of all points at the end."""
    out.mkdir(parents=True, exist_ok=True)
    device = describe_device()
    axes = [k for k, _ in points[0].values] if points else []
    rows: list[dict[str, Any]] = []
    start = time.monotonic()
    for i, point in enumerate(points, start=1):
        shown = " ".join(f"{k}={v}" for k, v in point.values) or "base flags"
        print(f"[sweep] {i}/{len(points)} {shown}: started ({clock(time.monotonic() - start)} "
              "into the sweep)", flush=True)
        rows.append({**run_point(point, base, out, timeout_s), "device": device})
        sweep_report.write(rows, axes, out)
        print(f"[sweep] {i}/{len(points)} {shown}: {outcome(rows[-1])}", flush=True)
    print(sweep_report.brief(rows, axes), flush=True)
    return rows


def outcome(row: dict[str, Any]) -> str:
    """How one point ended, in a few words."""
    took = f" in {row['wall_s']:.0f} s" if "wall_s" in row else " (finished before)"
    if row["status"] != "ok":
        return f"failed{took}, exit code {row.get('exit_code')}: {row.get('error', '')}"
    efficiency = (f", weak-scaling efficiency {row['scaling_efficiency']:.2f}"
                  if "scaling_efficiency" in row else "")
    return (f"ok{took}: {row['images_per_sec']:.2f} images/s on {row['num_workers']} "
            f"worker(s), step {row['step_time_ms']:.0f} ms{efficiency}")


def dry_run(points: Sequence[Point], base: Sequence[str], out: Path) -> int:
    """Prints each point's check and command; 0 if every point would start, else 2."""
    refused = 0
    for i, point in enumerate(points, start=1):
        error = check_point(point, base)
        refused += bool(error)
        command = shlex.join(train_command(point, base, out / "points" / point.name))
        print(f"[sweep] {i}/{len(points)} {point.name}: "
              + (f"error: {error}" if error else f"ok: {command}"), flush=True)
    return 2 if refused else 0


def main(argv: list[str]) -> int:
    try:
        points = parse_grid(_GRID.value)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if _DRY_RUN.value:
        return output.ends_quietly(dry_run)(points, argv[1:], Path(_OUT.value))
    output.divert_when_reader_leaves(Path(_OUT.value) / "sweep.log", "tfscale.sweep")
    rows = sweep(points, argv[1:], Path(_OUT.value), _TIMEOUT.value)
    failed = sum(r["status"] != "ok" for r in rows)
    print(f"[sweep] {len(rows) - failed} ok, {failed} failed; table: {_OUT.value}/sweep.md")
    return 0


def entry() -> None:
    """The ``tfscale-sweep`` command (and ``python -m tfscale.sweep``)."""
    command.own_top_level_packages()
    command.absl_help("tfscale.sweep", __doc__ or "", __name__)
    app.run(main, flags_parser=parse_flags)


if __name__ == "__main__":
    entry()
