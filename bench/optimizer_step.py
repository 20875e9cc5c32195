"""What an optimizer step costs: Keras' SGD with momentum against tfscale's fused one.

``tfscale.training.optimizers.SGD`` takes TensorFlow's ``ResourceApplyKerasMomentum`` kernel
for the update that Keras' ``SGD`` writes as four element-wise operations (one pass over each
variable instead of four, and no temporaries). This bench applies one step of random gradients
to the weights of ``mlp`` (32 px, 1000 classes: 9.4 MB) and ``resnet50`` (224 px, 1000
classes: 102 MB) with each, one core and one TensorFlow thread of each kind, each call after a
pass over 64 MB of other memory (as a training step's forward and backward pass leave the
caches). Rounds alternate the two; figures are medians of the per-round medians, and
``ratio`` = Keras' time / tfscale's.

    python -m bench.optimizer_step [--rounds 4 --calls 50]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

from bench.common import cpu_description, in_round_order, save, table

RUNS = ("keras", "tfscale")


def _shapes(model: str) -> list[tuple[int, ...]]:
    import keras

    if model == "mlp":
        return [(32 * 32 * 3, 512), (512,), (512, 512), (512,), (512, 1000), (1000,)]
    built = keras.applications.ResNet50(weights=None)
    return [tuple(w.shape) for w in built.trainable_weights]


def _step(optimizer: Any, grads: list[Any], variables: list[Any]) -> Any:
    import tensorflow as tf

    return tf.function(lambda: optimizer.apply(grads, variables))


def measure(rounds: int, calls: int) -> dict[str, Any]:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    import keras
    import numpy as np
    import tensorflow as tf

    from tfscale.training.optimizers import SGD

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    other = np.ones(16 * 1024 * 1024, np.float32)
    rows = []
    for model in ("mlp", "resnet50"):
        shapes = _shapes(model)
        rng = np.random.default_rng(0)
        grads = [tf.constant(rng.standard_normal(s).astype(np.float32)) for s in shapes]
        steps = {}
        for run, cls in zip(RUNS, (keras.optimizers.SGD, SGD), strict=True):
            variables = [keras.Variable(np.zeros(s, np.float32)) for s in shapes]
            optimizer = cls(0.01, momentum=0.9)
            optimizer.build(variables)
            steps[run] = _step(optimizer, grads, variables)
            steps[run]()
        medians: dict[str, list[float]] = {run: [] for run in RUNS}
        for r in range(rounds):
            for run in in_round_order(RUNS, r):
                times = []
                for _ in range(calls):
                    other += 1.0  # a step's other memory traffic
                    start = time.perf_counter()
                    steps[run]()
                    times.append(time.perf_counter() - start)
                medians[run].append(statistics.median(times) * 1000)
        keras_ms, ours_ms = (statistics.median(medians[run]) for run in RUNS)
        rows.append({"model": model, "megabytes": sum(int(np.prod(s)) for s in shapes) * 4e-6,
                     "keras_ms": keras_ms, "tfscale_ms": ours_ms, "ratio": keras_ms / ours_ms,
                     "keras_range": f"{min(medians['keras']):.3g}-{max(medians['keras']):.3g}",
                     "tfscale_range": f"{min(medians['tfscale']):.3g}-"
                                      f"{max(medians['tfscale']):.3g}"})
    return {"cpu": cpu_description(), "rounds": rounds, "calls": calls, "rows": rows}


def report(result: dict[str, Any]) -> str:
    return (f"CPU: {result['cpu']}; {result['rounds']} rounds of {result['calls']} calls\n\n"
            + table(result["rows"], ["model", "megabytes", "keras_ms", "keras_range",
                                     "tfscale_ms", "tfscale_range", "ratio"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    result = measure(args.rounds, args.calls)
    save("optimizer_step", result)
    print(report(result))


if __name__ == "__main__":
    main()
