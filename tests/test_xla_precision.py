"""Every XLA x precision combination trains a tiny model under default; under horovod (2 worker
processes each) every XLA mode and every precision once, the whole matrix with
TFSCALE_FULL_MATRIX=1."""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path

import pytest

from tests.conftest import TINY, read_results, requires_horovod, run_train

COMBOS = list(itertools.product(("off", "jit", "auto"),
                                ("fp32", "mixed_float16", "mixed_bfloat16")))
# Each XLA mode and each precision once (CI time); TFSCALE_FULL_MATRIX=1 runs all nine.
DIAGONAL = [("off", "fp32"), ("jit", "mixed_float16"), ("auto", "mixed_bfloat16")]
HOROVOD_COMBOS = COMBOS if os.environ.get("TFSCALE_FULL_MATRIX") == "1" else DIAGONAL


@pytest.mark.parametrize(("xla", "precision"), COMBOS)
def test_default_strategy(xla: str, precision: str, tmp_path: Path) -> None:
    proc = run_train(*TINY, "--steps=3", f"--xla={xla}", f"--precision={precision}",
                     f"--model_dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert math.isfinite(read_results(tmp_path)["final_loss"])


@pytest.mark.slow
@requires_horovod
@pytest.mark.parametrize(("xla", "precision"), HOROVOD_COMBOS)
def test_horovod_strategy(xla: str, precision: str, tmp_path: Path) -> None:
    proc = run_train(*TINY, "--steps=3", "--strategy=horovod", "--num_processes=2",
                     f"--xla={xla}", f"--precision={precision}", f"--model_dir={tmp_path}")
    assert proc.returncode == 0, proc.stdout[-3000:]
    results = read_results(tmp_path)
    assert results["num_workers"] == 2 and math.isfinite(results["final_loss"])
