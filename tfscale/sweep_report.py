"""The sweep's results table (CSV, JSON, Markdown) and plots (throughput, scaling efficiency)."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

RESULT_COLUMNS = ("num_workers", "global_batch_size", "steps", "images_per_sec",
                  "images_per_sec_per_worker", "step_time_ms", "final_loss")
SCALE_AXIS = "num_processes"


def add_scaling_efficiency(rows: list[dict[str, Any]], axes: Sequence[str]) -> None:
    """Adds ``scaling_efficiency`` = per-worker throughput / the 1-worker point's, for points
    that differ from a finished 1-worker point only in the number of workers (weak scaling)."""
    group_axes = [a for a in axes if a != SCALE_AXIS]
    baseline: dict[tuple[Any, ...], float] = {}
    for row in rows:
        if row["status"] == "ok" and row.get("num_workers") == 1:
            baseline[tuple(row.get(a) for a in group_axes)] = row["images_per_sec_per_worker"]
    for row in rows:
        base = baseline.get(tuple(row.get(a) for a in group_axes))
        if row["status"] == "ok" and base:
            row["scaling_efficiency"] = round(row["images_per_sec_per_worker"] / base, 4)


def _columns(rows: Sequence[dict[str, Any]], axes: Sequence[str]) -> list[str]:
    extra = [c for c in (*RESULT_COLUMNS, "scaling_efficiency", "wall_s", "status",
                         "exit_code", "error") if any(c in r for r in rows)]
    return [*axes, *extra]


def _cell(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def markdown(rows: Sequence[dict[str, Any]], axes: Sequence[str]) -> str:
    columns = _columns(rows, axes)
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_cell(r.get(c, "")).replace("|", "/") for c in columns) + " |"
              for r in rows]
    return "\n".join(lines) + "\n"


def plot(rows: Sequence[dict[str, Any]], axes: Sequence[str], out: Path) -> list[Path]:
    """throughput.png and scaling.png against the number of workers, a line per setting."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    group_axes = [a for a in axes if a != SCALE_AXIS]
    series: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["status"] == "ok":
            label = ", ".join(f"{a}={row[a]}" for a in group_axes) or "all"
            series[label].append(row)
    written = []
    for name, key, ylabel in (("throughput.png", "images_per_sec", "images/sec (total)"),
                              ("scaling.png", "scaling_efficiency",
                               "weak-scaling efficiency")):
        fig, ax = plt.subplots(figsize=(7, 4.5))
        for label, points in sorted(series.items()):
            pts = sorted((r["num_workers"], r[key]) for r in points if key in r)
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=label)
        if key == "scaling_efficiency":
            ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.set_xlabel("workers")
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        written.append(out / name)
    return written


def write(rows: list[dict[str, Any]], axes: Sequence[str], out: Path) -> None:
    """Writes sweep.json, sweep.csv, sweep.md and the plots into ``out``."""
    add_scaling_efficiency(rows, axes)
    (out / "sweep.json").write_text(json.dumps(rows, indent=2) + "\n")
    columns = _columns(rows, axes)
    with open(out / "sweep.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    (out / "sweep.md").write_text(markdown(rows, axes))
    plot(rows, axes, out)
