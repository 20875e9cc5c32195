"""Plan a run before the allocation: throughput, efficiency, the recommended gradient exchange
and time to accuracy at N nodes, from a machine file (docs/FORECAST.md).

The command line is ``python -m tfscale.forecast`` (:mod:`tfscale.cli.forecast`); the pieces
are importable for scripts and tests. Nothing here imports TensorFlow.
"""

from tfscale.forecast.accuracy import AccuracyTable, load_table
from tfscale.forecast.machines import Machine, load, presets
from tfscale.forecast.model import (
    Exchange,
    Link,
    flat_allreduce_s,
    hierarchical_allreduce_s,
    overlap_exchange,
    reduce_scatter_s,
    ring_allreduce_s,
)
from tfscale.forecast.predict import Plan, Row, compare_measured, forecast

__all__ = [
    "AccuracyTable", "Exchange", "Link", "Machine", "Plan", "Row", "compare_measured",
    "flat_allreduce_s", "forecast", "hierarchical_allreduce_s", "load", "load_table",
    "overlap_exchange", "presets", "reduce_scatter_s", "ring_allreduce_s",
]
