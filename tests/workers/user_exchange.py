"""Worker for tests/test_user_exchange.py: a user's own script, Horovod-style or
MultiWorkerMirroredStrategy-style, whose gradients should take the node exchange that
``tfscale.train`` uses.

Every worker trains the same small dense model with SGD + momentum for ``STEPS`` steps; worker
``r`` reads rows ``[r*B, (r+1)*B)`` of each global batch of ``WORKERS*B`` rows (the Horovod
script slices them itself; the MWMS script gives Keras the global batches, which it shards that
way), so the job should equal one process on the global batches. Each worker writes
``OUT/rank<R>.npz`` (final weights) and ``OUT/rank<R>.json`` (exchange plan, how many
shared-memory segments carried tensors, host collectives, history); rank 0 writes
``OUT/initial.npz`` (the weights every worker starts from).

Without Horovod or TF_CONFIG variables it is the launcher: it starts ``--workers`` copies of
itself through tfscale's local launcher (Horovod's Gloo rendezvous or TF_CONFIG on loopback).

    python -m tests.workers.user_exchange --style=horovod --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402

WORKERS, BATCH, STEPS, FEATURES, CLASSES = 2, 4, 3, 6, 3
LEARNING_RATE, MOMENTUM = 0.1, 0.9


def data() -> tuple[np.ndarray, np.ndarray]:
    """The whole job's rows, in global-batch order."""
    rng = np.random.default_rng(7)
    x = rng.normal(size=(STEPS * WORKERS * BATCH, FEATURES)).astype("float32")
    y = rng.integers(0, CLASSES, size=STEPS * WORKERS * BATCH).astype("int64")
    return x, y


def model() -> Any:
    import keras

    return keras.Sequential([keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"),
                             keras.layers.Dense(CLASSES)])


def compile_args() -> dict[str, Any]:
    import keras

    return {"loss": keras.losses.SparseCategoricalCrossentropy(from_logits=True)}


def horovod_style(out: Path) -> dict[str, Any]:
    import keras

    import tfscale.horovod as hvd
    from tfscale.scripts import horovod_api as runtime

    hvd.init()
    rank, size = hvd.rank(), hvd.size()
    keras.utils.set_random_seed(rank)  # different on purpose: the broadcast aligns them
    net = model()
    if rank == 0:
        np.savez(out / "initial.npz", *net.get_weights())
    divisors = _record_divisors(runtime.node_reduction())
    opt = hvd.DistributedOptimizer(keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM))
    net.compile(optimizer=opt, **compile_args())
    x, y = data()
    rows = np.arange(len(x)).reshape(STEPS, size, -1)[:, rank].reshape(-1)
    history = net.fit(x[rows], y[rows], batch_size=len(rows) // STEPS, shuffle=False,
                      verbose=0, callbacks=[hvd.callbacks.BroadcastGlobalVariablesCallback(0),
                                            hvd.callbacks.MetricAverageCallback()])
    reduce = runtime.node_reduction()
    return {
        "weights": net.get_weights(), "history": history.history,
        "plan": runtime.exchange_plan().describe(),
        "segments": 0 if reduce is None or reduce.node is None else len(reduce.node._segments),
        "exchange_divisors": sorted(divisors),
        "allreduce": float(hvd.allreduce(np.float32(rank + 1), op=hvd.Sum).numpy()),
        "mean": float(hvd.allreduce(np.float64(rank)).numpy()),
        "max": int(hvd.allreduce(np.int32(rank + 4), op=hvd.Max).numpy()),
        "broadcast": float(hvd.broadcast(np.float32(rank + 5), root_rank=1).numpy()),
        "rank": rank,
    }


def _record_divisors(reduce: Any) -> set[int]:
    """The divisors of the gradients' shared-memory exchanges from now on: {1} where Keras'
    step divides the loss and the exchange sums, {workers} where the exchange divides."""
    from tfscale.exchange import hierarchical

    divisors: set[int] = set()
    if reduce is None or reduce.node is None:
        return divisors
    exchange, native = reduce.node.all_reduce, hierarchical.native_all_reduce

    def recorded(*tensors: Any, **kwargs: Any) -> Any:  # the exchange in tf.numpy_function
        divisors.add(int(kwargs.get("divisor", 1)))
        return exchange(*tensors, **kwargs)

    def recorded_op(node: Any, values: Any, divisor: int, copy: bool, name: str) -> Any:
        outs = native(node, values, divisor, copy, name)  # the exchange as its op (traced)
        if outs is not None:
            divisors.add(int(divisor))
        return outs

    reduce.node.all_reduce = recorded
    hierarchical.native_all_reduce = recorded_op
    return divisors


def mwms_style(out: Path) -> dict[str, Any]:
    import tensorflow as tf

    import tfscale.multiworker

    tfscale.multiworker.enable()
    rank = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
    tf.keras.utils.set_random_seed(rank)  # the strategy broadcasts worker 0's initial values
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        net = model()
        net.compile(optimizer=tf.keras.optimizers.SGD(LEARNING_RATE, momentum=MOMENTUM),
                    **compile_args())
    if rank == 0:
        np.savez(out / "initial.npz", *net.get_weights())
    x, y = data()
    # Repeated, as the tutorial's is: each worker then iterates its own shard of it as it is.
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(len(x) // STEPS).repeat()
    history = net.fit(dataset, epochs=1, steps_per_epoch=STEPS, verbose=0)
    reduce = tfscale.multiworker.all_reduce_of(strategy)
    return {
        "weights": net.get_weights(), "history": history.history,
        "plan": "" if reduce is None or reduce.plan is None else reduce.plan.describe(),
        "segments": 0 if reduce is None or reduce.node is None else len(reduce.node._segments),
        "rank": rank,
    }


def launch(style: str, out: Path) -> int:
    from tfscale.scripts.launcher import horovod_envs, supervise, tf_config_envs

    command = [sys.executable, "-m", "tests.workers.user_exchange", f"--style={style}",
               f"--out={out}"]
    if style == "mwms":
        return supervise(command, tf_config_envs(WORKERS))
    envs, server = horovod_envs([("localhost", WORKERS)])
    return supervise(command, envs, on_exit=server.stop)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--style", choices=("horovod", "mwms"), required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if "HOROVOD_RANK" not in os.environ and "TF_CONFIG" not in os.environ:
        sys.exit(launch(args.style, out))
    result = horovod_style(out) if args.style == "horovod" else mwms_style(out)
    rank = result.pop("rank")
    np.savez(out / f"rank{rank}.npz", *result.pop("weights"))
    result["history"] = {k: [float(v) for v in vs] for k, vs in result["history"].items()}
    (out / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    main()
