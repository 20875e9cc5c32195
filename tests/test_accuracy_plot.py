"""bench.accuracy's plot: title, whole-number epochs, visible overlapping runs, the legend off
the curves (drawn from made-up histories, no training)."""

from __future__ import annotations

from typing import Any

from bench.accuracy import figure


def _runs() -> list[dict[str, Any]]:
    # Two runs with identical curves (they would hide each other) and a third.
    curve = [0.1, 0.5, 0.9, 0.96, 0.97]
    return [{"name": name, "seed": 0, "global_batch": 32,
             "history": [{"epoch": e + 1, "seconds": 10.0 * (e + 1),
                          "val_accuracy": a - shift} for e, a in enumerate(curve)]}
            for name, shift in (("keras", 0.0), ("default", 0.0), ("horovod x2", 0.05))]


def test_accuracy_plot_title_ticks_markers_and_legend() -> None:
    fig = figure(_runs(), 0.95, "AMD EPYC (avx2 fma)")
    fig.canvas.draw()
    title = fig._suptitle.get_text()
    assert "resnet50_tiny" in title and "digits" in title and "CPU: AMD EPYC" in title
    seconds, epochs = fig.axes
    ticks = [t for t in epochs.get_xticks() if 1 <= t <= 5]
    assert ticks and all(float(t).is_integer() for t in ticks)
    assert seconds.get_ylim()[0] == 0
    for ax in (seconds, epochs):
        curves = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
        assert len({(ln.get_marker(), ln.get_color()) for ln in curves}) == 3
    legend = fig.legends[0].get_window_extent()
    assert all(legend.y1 < ax.get_window_extent().y0 for ax in fig.axes), "legend on the axes"
