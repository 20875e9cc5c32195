"""The forecast's PNG: images/s and efficiency against node count and, with an epochs curve,
epochs needed and minutes to the target (matplotlib, lazily)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tfscale.forecast.predict import Row, fastest

if TYPE_CHECKING:
    from tfscale.forecast.efficiency import EpochsCurve


def write_png(rows: Sequence[Row], path: str | Path, title: str,
              published: Mapping[int, float] | None = None,
              curve: EpochsCurve | None = None) -> Path:
    """Panels over node count (log2): images/s (log) and efficiency (from 0); with ``curve``,
    also epochs to its target and minutes to it, the node count with the fewest minutes
    marked. Node counts whose global batch the curve did not measure are left out of those
    two panels and named in them. Published images/s, when given, are drawn beside the
    forecast.

    Raises:
        ValueError: when matplotlib is missing (``pip install 'tfscale[plots]'``).
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ValueError("the plot needs matplotlib: pip install 'tfscale[plots]'") from err
    nodes = [r.nodes for r in rows]
    fig, axes = plt.subplots(2 if curve else 1, 2, figsize=(11, 8.6 if curve else 4.4),
                             squeeze=False)
    rate_ax, eff_ax = axes[0]
    rate_ax.plot(nodes, [r.images_per_sec for r in rows], "o-", label="forecast")
    rate_ax.plot(nodes, [rows[0].images_per_sec / rows[0].nodes * n for n in nodes], ":",
                 color="grey", label="perfect scaling")
    eff_ax.plot(nodes, [100 * r.efficiency for r in rows], "o-", label="forecast")
    if published:
        points = sorted(published.items())
        base = points[0][1] / points[0][0]
        rate_ax.plot([n for n, _ in points], [v for _, v in points], "s--",
                     label="measured / published")
        eff_ax.plot([n for n, _ in points], [100 * v / (base * n) for n, v in points], "s--",
                    label="measured / published")
    rate_ax.set_yscale("log")
    rate_ax.set_ylabel("images/s")
    rate_ax.set_title("Throughput")
    eff_ax.set_ylim(0, 105)
    eff_ax.set_ylabel("efficiency vs 1 node (%)")
    eff_ax.set_title("Scaling efficiency")
    if curve:
        _time_panels(axes[1], rows, curve)
    for ax in axes.flat:
        ax.set_xscale("log", base=2)
        ax.set_xticks(nodes, [str(n) for n in nodes])
        ax.set_xlabel("nodes")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower left" if ax is eff_ax else "upper left", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _time_panels(axes: Sequence[Any], rows: Sequence[Row], curve: EpochsCurve) -> None:
    """Epochs needed and minutes to the target; the fastest node count marked."""
    epochs_ax, minutes_ax = axes
    known = [(r, curve.epochs(r.global_batch), curve.minutes(r.global_batch, r.images_per_sec))
             for r in rows]
    drawn = [(r.nodes, e, m) for r, e, m in known if e is not None and m is not None]
    missing = [r.nodes for r, e, m in known if e is None or m is None]
    epochs_ax.plot([n for n, _, _ in drawn], [e for _, e, _ in drawn], "o-", color="tab:green")
    epochs_ax.set_ylabel(f"epochs to {curve.target}")
    epochs_ax.set_title(f"Epochs needed ({curve.path.name})")
    epochs_ax.set_ylim(bottom=0)
    minutes_ax.plot([n for n, _, _ in drawn], [m for _, _, m in drawn], "o-", color="tab:red")
    minutes_ax.set_yscale("log")
    minutes_ax.set_ylabel("minutes to the target")
    minutes_ax.set_title("Time to the target")
    best = fastest(rows, curve)
    if best is not None:
        minutes = curve.minutes(best.global_batch, best.images_per_sec)
        for ax in (epochs_ax, minutes_ax):
            ax.axvline(best.nodes, color="black", linestyle="--", alpha=0.6)
        minutes_ax.annotate(f"fewest: {best.nodes} nodes, {minutes:.3g} min",
                            (best.nodes, minutes), textcoords="offset points", xytext=(6, 10),
                            fontsize=9)
    if missing:
        note = f"not known at {', '.join(str(n) for n in missing)} nodes"
        for ax in (epochs_ax, minutes_ax):
            ax.set_title(f"{ax.get_title()}\n({note}: not measured or not reached)",
                         fontsize=10)
