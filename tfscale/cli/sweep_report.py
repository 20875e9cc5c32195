"""The sweep's results table (CSV, JSON, Markdown) and plots (throughput, scaling efficiency)."""

from __future__ import annotations

import csv
import json
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

# Copied from each point's results.json into its row; the plots' title names them.
DESCRIPTION = ("model", "dataset")
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


# The terminal table: (column, row key, format)
BRIEF = (("images/s", "images_per_sec", "{:.2f}"), ("per worker", "images_per_sec_per_worker",
                                                    "{:.2f}"),
         ("step ms", "step_time_ms", "{:.0f}"), ("efficiency", "scaling_efficiency", "{:.2f}"),
         ("wall s", "wall_s", "{:.0f}"))


def brief(rows: Sequence[dict[str, Any]], axes: Sequence[str]) -> str:
    """A short aligned table of the points for the terminal: the axes, the throughput, the
    efficiency and the status (failed points with their exit code)."""
    header = [*axes, *(name for name, _, _ in BRIEF), "status"]
    body = [[str(r.get(a, "")) for a in axes]
            + [form.format(r[key]) if key in r else "-" for _, key, form in BRIEF]
            + [r["status"] if r["status"] == "ok" else f"{r['status']} ({r.get('exit_code')})"]
            for r in rows]
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]
    return "\n".join("  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True))
                     .rstrip() for line in [header, *body])


# Drawn so that lines on top of each other stay visible: each series its own marker, marker
# size and dash pattern, markers hollow.
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
LINESTYLES = ("-", "--", "-.", ":")


def title(rows: Sequence[dict[str, Any]]) -> str:
    """What the plots show: the models, datasets and devices of the finished points."""
    ok = [r for r in rows if r.get("status") == "ok"]
    return f"{names_of(ok, 'model')} on {names_of(ok, 'dataset')} ({names_of(ok, 'device')})"


def names_of(rows: Sequence[dict[str, Any]], key: str) -> str:
    """The distinct values of ``key`` among ``rows``, in order, or "?" when none has it."""
    return ", ".join(dict.fromkeys(str(r[key]) for r in rows if r.get(key))) or "?"


def plot(rows: Sequence[dict[str, Any]], axes: Sequence[str], out: Path) -> list[Path]:
    """Writes :func:`figures` as PNGs into ``out``."""
    import matplotlib.pyplot as plt

    written = []
    for name, fig in figures(rows, axes).items():
        fig.savefig(out / name, dpi=100)
        plt.close(fig)
        written.append(out / name)
    return written


def figures(rows: Sequence[dict[str, Any]], axes: Sequence[str]) -> dict[str, Any]:
    """throughput.png's and scaling.png's figures: against the number of workers, a line per
    setting of the other axes.

    The throughput plot has each setting's ideal scaling (its 1-worker throughput times the
    workers, dotted); the efficiency axis starts at 0; worker ticks are whole numbers; the
    legend sits beside the axes, where it covers no curve; the title names the models,
    datasets and device.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    group_axes = [a for a in axes if a != SCALE_AXIS]
    series: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        if row["status"] == "ok":
            label = ", ".join(f"{a}={row[a]}" for a in group_axes) or "all"
            series[label].append(row)
    workers = sorted({int(r["num_workers"]) for points in series.values() for r in points})
    made = {}
    for name, key, ylabel in (("throughput.png", "images_per_sec", "images/sec (total)"),
                              ("scaling.png", "scaling_efficiency",
                               "weak-scaling efficiency")):
        fig, ax = plt.subplots(figsize=(8.5, 4.5))
        for number, (label, points) in enumerate(sorted(series.items())):
            pts = sorted((int(r["num_workers"]), float(r[key])) for r in points if key in r)
            if not pts:
                continue
            line, = ax.plot(*zip(*pts, strict=True), label=label,
                            marker=MARKERS[number % len(MARKERS)],
                            markersize=9 - 1.5 * (number % 3), markerfacecolor="none",
                            linestyle=LINESTYLES[number % len(LINESTYLES)])
            one = [v for w, v in pts if w == 1]
            if key == "images_per_sec" and one and len(workers) > 1:
                ax.plot(workers, [one[0] * w for w in workers], ":", color=line.get_color(),
                        linewidth=1, alpha=0.7)
        if key == "images_per_sec" and len(workers) > 1:
            ax.plot([], [], ":", color="grey", label="ideal scaling (1 worker x workers)")
        if key == "scaling_efficiency":
            ax.axhline(1.0, color="grey", linewidth=0.8, linestyle=":",
                       label="ideal scaling (1.0)")
            ax.set_ylim(0, max(1.1, ax.get_ylim()[1]))
        else:
            ax.set_ylim(bottom=0)
        ax.set_xticks(workers or [1])
        ax.set_xlabel("workers")
        ax.set_ylabel(ylabel)
        ax.set_title(title(rows), fontsize=10)
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.02, 1.0),
                      borderaxespad=0)
        fig.tight_layout()
        made[name] = fig
    return made


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
