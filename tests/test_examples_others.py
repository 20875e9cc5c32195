"""examples/others: scripts in other projects' styles (keras.io's "Simple MNIST convnet",
TensorFlow's multi-worker Keras tutorial, Horovod's tensorflow2_keras_mnist.py) run under
``tfscale-run --nproc=2`` with at most 3 added or changed lines against their original-style
versions, which sit beside them (``NAME_original.py``).

Each run is the example as it is (``tests.workers.run_example`` runs it as ``__main__`` and
records its model's weights and losses): the two workers end with identical weights, and the
loss falls.
"""

from __future__ import annotations

import ast
import difflib
import json
import sys
from pathlib import Path

import numpy as np
import pytest

from bench.digits import DATA_PACKAGES
from tests.conftest import ROOT, requires_horovod, run_process

EXAMPLES = ROOT / "examples" / "others"
# Example -> the strategy tfscale-run starts it under.
CASES = {"keras_mnist_convnet": "horovod", "mwms_tutorial": "multiworker",
         "horovod_keras_mnist": "horovod"}


def _code(path: Path) -> list[str]:
    """The file's non-blank lines after its module docstring (which says what changed and
    why)."""
    text = path.read_text()
    first = ast.parse(text).body[0]
    skip = first.end_lineno if isinstance(first, ast.Expr) and isinstance(
        first.value, ast.Constant) else 0
    return [line for line in text.splitlines()[skip or 0:] if line.strip()]


def changed_lines(name: str, folder: Path = EXAMPLES) -> tuple[int, int]:
    """(added, removed) lines of code from ``NAME_original.py`` to ``NAME.py``."""
    diff = list(difflib.unified_diff(_code(folder / f"{name}_original.py"),
                                     _code(folder / f"{name}.py"), lineterm="", n=0))
    added = sum(1 for line in diff if line.startswith("+") and not line.startswith("+++"))
    removed = sum(1 for line in diff if line.startswith("-") and not line.startswith("---"))
    return added, removed


@pytest.mark.parametrize("name", sorted(CASES))
def test_at_most_three_lines_change(name: str) -> None:
    added, removed = changed_lines(name)
    assert 1 <= added <= 3 and removed <= 3, (name, added, removed)


def test_the_line_count_sees_a_change(tmp_path: Path) -> None:
    body = '"""Doc."""\nimport a\nb = 1\n'
    (tmp_path / "x_original.py").write_text(body)
    (tmp_path / "x.py").write_text(body.replace("b = 1", "b = 2\nc = 3"))
    assert changed_lines("x", tmp_path) == (2, 1)


@pytest.mark.slow
@requires_horovod
@pytest.mark.parametrize("name", sorted(CASES))
def test_runs_on_two_workers_with_identical_weights_and_a_falling_loss(
        name: str, tmp_path: Path) -> None:
    proc = run_process([sys.executable, "-m", "tfscale.run", "--nproc=2",
                        f"--strategy={CASES[name]}", "-m", "tests.workers.run_example",
                        str(EXAMPLES / f"{name}.py"), str(tmp_path)],
                       timeout=300, env={"PYTHONPATH": f"{ROOT}:{DATA_PACKAGES}"}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    weights = [np.load(tmp_path / f"rank{r}.npz") for r in range(2)]
    assert weights[0].files
    for key in weights[0].files:
        np.testing.assert_array_equal(weights[0][key], weights[1][key])
    for rank in range(2):
        loss = json.loads((tmp_path / f"rank{rank}.json").read_text())["loss"]
        assert len(loss) == 3 and loss[-1] < loss[0], (rank, loss)
