"""Helpers shared by the strategy-equivalence tests."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np

from tests.conftest import run_process

WORKER = [sys.executable, "-m", "tests.workers.equivalence"]


def load_weights(path: Path) -> list[np.ndarray]:
    with np.load(path) as data:
        return [data[f"arr_{i}"] for i in range(len(data.files))]


def max_abs_diff(a: list[np.ndarray], b: list[np.ndarray]) -> float:
    assert len(a) == len(b)
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b, strict=True))


# (batch, steps, xla, momentum) -> the folder of that reference's run, kept for the pytest
# process: the run is deterministic, and a dozen tests compare against the same few.
_REFERENCES: dict[tuple[int, int, str, float], Path] = {}


def reference(out: Path, batch: int, steps: int = 1, xla: str = "off",
              momentum: float = 0.0) -> list[np.ndarray]:
    """Single-device run on the combined batch; its files are in ``out`` (copied there if this
    process ran it already)."""
    key = (batch, steps, xla, momentum)
    if key in _REFERENCES:
        shutil.copytree(_REFERENCES[key], out, dirs_exist_ok=True)
    else:
        proc = run_process([*WORKER, "--strategy=default", f"--batch={batch}",
                            f"--steps={steps}", f"--xla={xla}", f"--momentum={momentum}",
                            f"--out={out}"], timeout=180)
        assert proc.returncode == 0, proc.stderr[-3000:]
        _REFERENCES[key] = out
    return load_weights(out / "rank0.npz")


def assert_replicas_equal(out: Path, ranks: int, name: str = "") -> list[np.ndarray]:
    """All ranks' weights (or, with ``name`` "_momentum", momentum) are identical; returns
    rank 0's."""
    weights = [load_weights(out / f"rank{r}{name}.npz") for r in range(ranks)]
    for r in range(1, ranks):
        assert max_abs_diff(weights[0], weights[r]) == 0.0, f"rank {r} differs from rank 0"
    return weights[0]
