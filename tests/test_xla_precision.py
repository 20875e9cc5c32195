"""XLA modes x precisions train a tiny model under default and under horovod (2 worker processes
each): in CI each strategy runs every XLA mode and every precision once, on complementary
diagonals (six of the nine pairs between them); TFSCALE_FULL_MATRIX=1 runs all nine for each."""

from __future__ import annotations

import itertools
import math
import os
from pathlib import Path

import pytest

from tests.conftest import TINY, read_results, requires_horovod, run_train

COMBOS = list(itertools.product(("off", "jit", "auto"),
                                ("fp32", "mixed_float16", "mixed_bfloat16")))
# Each XLA mode and each precision once per strategy (CI time: a training process is 2.5-4 s,
# most of it TensorFlow's import), each strategy on its own diagonal.
FULL = os.environ.get("TFSCALE_FULL_MATRIX") == "1"
DEFAULT_COMBOS = COMBOS if FULL else [("off", "mixed_bfloat16"), ("jit", "fp32"),
                                      ("auto", "mixed_float16")]
HOROVOD_COMBOS = COMBOS if FULL else [("off", "fp32"), ("jit", "mixed_float16"),
                                      ("auto", "mixed_bfloat16")]


@pytest.mark.parametrize(("xla", "precision"), DEFAULT_COMBOS)
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
