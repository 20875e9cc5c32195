"""The forecast's PNG: images/s and efficiency against node count (matplotlib, lazily)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path

from tfscale.forecast.predict import Row


def write_png(rows: Sequence[Row], path: str | Path, title: str,
              published: Mapping[int, float] | None = None) -> Path:
    """Two panels over node count (log2): images/s (log) and efficiency (from 0). Published
    images/s, when given, are drawn beside the forecast.

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
    fig, (rate_ax, eff_ax) = plt.subplots(1, 2, figsize=(11, 4.4))
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
    for ax in (rate_ax, eff_ax):
        ax.set_xscale("log", base=2)
        ax.set_xticks(nodes, [str(n) for n in nodes])
        ax.set_xlabel("nodes")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower left" if ax is eff_ax else "upper left")
    rate_ax.set_yscale("log")
    rate_ax.set_ylabel("images/s")
    rate_ax.set_title("Throughput")
    eff_ax.set_ylim(0, 105)
    eff_ax.set_ylabel("efficiency vs 1 node (%)")
    eff_ax.set_title("Scaling efficiency")
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
