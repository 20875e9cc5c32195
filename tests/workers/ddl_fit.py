"""Worker for the DDL user-script test: a plain ``model.fit`` in IBM DDL's style.

Each learner reads its own data and starts from its own random weights; a callback in the
middle of the list then shifts its weights by its rank at train begin (standing in for any
callback that sets weights then, such as ``BackupAndRestore``). ``DDLGlobalVariablesBroadcast``
must come after it to leave the learners identical; ``DDLMetricSync`` first makes History hold
job-wide averages. Gradients go through the hierarchical all-reduce. ``--order=wrong`` puts the
broadcast first. Each learner writes ``OUT/rank<R>.npz`` and ``OUT/rank<R>.json``.

    python -m tests.workers.simulated_nodes --np 2 --per_node 1 -- \
        python -m tests.workers.ddl_fit --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import keras  # noqa: E402
import numpy as np  # noqa: E402

from tfscale.callbacks import DDLGlobalVariablesBroadcast, DDLMetricSync  # noqa: E402
from tfscale.exchange import HierarchicalAllReduce, with_gradient_reduction  # noqa: E402


class ShiftWeightsByRank(keras.callbacks.Callback):
    """Makes the learners' weights differ when training begins."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        self.model.set_weights([w + self.rank for w in self.model.get_weights()])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--order", choices=("ddl", "wrong"), default="ddl")
    args = parser.parse_args()
    reduce = HierarchicalAllReduce.create()
    rank, size = reduce.topology.rank, reduce.topology.size
    keras.utils.set_random_seed(rank)
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(64, 6)).astype("float32")
    y = (x[:, :3].sum(axis=1) > 0).astype("int32")
    model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(2)])
    model.compile(optimizer=with_gradient_reduction(keras.optimizers.SGD(0.05 * size), reduce),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    middle = ShiftWeightsByRank(rank)
    callbacks = ([DDLMetricSync(), middle, DDLGlobalVariablesBroadcast()] if args.order == "ddl"
                 else [DDLMetricSync(), DDLGlobalVariablesBroadcast(), middle])
    history = model.fit(x, y, batch_size=8, epochs=2, verbose=0, callbacks=callbacks)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    np.savez(out / f"rank{rank}.npz", *model.get_weights())
    local_loss = float(model.evaluate(x, y, verbose=0))
    (out / f"rank{rank}.json").write_text(json.dumps(
        {"history": history.history["loss"], "local_loss": local_loss}))


if __name__ == "__main__":
    main()
