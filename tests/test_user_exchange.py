"""Users' own scripts exchange gradients as ``tfscale.train`` does: through shared memory on a
node whose ranks all see the same ``/dev/shm``.

Two real workers per style (``tests/workers/user_exchange.py``): a Horovod-style script on
``tfscale.horovod`` (Gloo rendezvous, as horovodrun makes it) and a TF-tutorial MWMS script with
``tfscale.multiworker.enable()`` (TF_CONFIG on loopback). Each run asserts that the exchange was
shared memory and carried the gradients, that both workers end with identical weights, and
that 2 workers x B equal 1 process x 2B (< 1e-5); the Horovod run also checks its host
collectives (all-reduce of each op, broadcast), which take the same exchange.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import keras
import numpy as np
import pytest

from tests.conftest import requires_horovod, run_process
from tests.equivalence import assert_replicas_equal, load_weights, max_abs_diff
from tests.workers import user_exchange as script


def _run(style: str, out: Path) -> list[dict[str, Any]]:
    proc = run_process([sys.executable, "-m", "tests.workers.user_exchange", f"--style={style}",
                        f"--out={out}"], timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(script.WORKERS)]


def _one_process(initial: list[np.ndarray]) -> list[np.ndarray]:
    """One process on the global batches, from the workers' initial weights."""
    x, y = script.data()
    model = script.model()
    model.set_weights(initial)
    model.compile(optimizer=keras.optimizers.SGD(script.LEARNING_RATE,
                                                 momentum=script.MOMENTUM),
                  **script.compile_args())
    model.fit(x, y, batch_size=script.WORKERS * script.BATCH, shuffle=False, verbose=0)
    return model.get_weights()


@pytest.mark.slow
@pytest.mark.parametrize("style", [pytest.param("horovod", marks=requires_horovod), "mwms"])
def test_user_script_exchanges_through_shared_memory_and_equals_one_process(
        style: str, tmp_path: Path) -> None:
    logs = _run(style, tmp_path)
    for log in logs:
        assert log["plan"] == "inside a node: shared memory", log
        assert log["segments"] >= 1, "the shared-memory exchange carried no tensors"
    weights = assert_replicas_equal(tmp_path, script.WORKERS)
    initial = load_weights(tmp_path / "initial.npz")
    assert max_abs_diff(weights, initial) > 1e-3, "training moved the weights"
    assert max_abs_diff(weights, _one_process(initial)) < 1e-5
    # The logged loss is the job's average on both workers.
    assert logs[0]["history"] == logs[1]["history"]
    if style == "horovod":
        for log in logs:
            # The exchange sums the gradients of a loss that Keras' step divided by 2.
            assert log["exchange_divisors"] == [1], log
            assert (log["allreduce"], log["mean"], log["max"], log["broadcast"]) == (
                3.0, 0.5, 5, 6.0)
