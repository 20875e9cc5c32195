"""Averaging of logged metrics across workers."""

from __future__ import annotations

from typing import Any

import keras
import numpy as np

from tfscale.exchange.interface import Collectives, default_collectives


class MetricAverage(keras.callbacks.Callback):
    """Replaces each epoch's logged metrics by their mean over all workers.

    Place it before callbacks that read the logs (loggers, checkpoints, early stopping) so they
    see job-wide values. Every worker must run it (it is a collective).
    """

    def __init__(self, comm: Collectives | None = None) -> None:
        super().__init__()
        self._comm = comm

    def average(self, logs: dict[str, Any]) -> None:
        """Averages the numeric entries of ``logs`` in place across workers."""
        keys = sorted(k for k, v in logs.items() if np.ndim(v) == 0)
        if not keys:
            return
        comm = default_collectives(self._comm)
        means = comm.all_reduce([float(logs[k]) for k in keys], "mean")
        logs.update({k: float(m) for k, m in zip(keys, means, strict=True)})

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if logs is not None:
            self.average(logs)
