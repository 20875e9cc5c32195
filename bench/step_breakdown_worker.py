"""One worker of ``bench.step_breakdown``: times the parts of a training step in this process.

Every part runs the same number of times on every rank, in the same order, so the
collectives match up. Rank 0 prints one line ``BREAKDOWN {json}`` with milliseconds per step:

- ``compute``: the model's training step (forward, backward, update) on its own batch, compiled
  as ``tfscale.train`` compiles it (loss, metrics, SGD with momentum), with no exchange;
- ``step``: the same step under the strategy (gradient exchange included), the loss read back
  to Python after each step as ``model.fit`` does for its callbacks;
- ``step_lag``: the same with ``--gradient_lag=1`` (Horovod strategies only);
- ``allreduce``: a bare all-reduce of tensors of the gradients' shapes (the exchange's floor);
- ``host_allreduce``: one collective on two host numbers, what tfscale's guard runs per step;
- ``read_step``: reading the optimizer's step counter back to Python.

    python -m bench.step_breakdown_worker --strategy horovod   (under a launcher)
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")


def bind_to_own_core() -> None:
    """One core per worker, before TensorFlow starts its thread pools: by global rank, since
    the ddl runs simulate one node per worker, where every local rank is 0."""
    rank = int(os.environ.get("HOROVOD_RANK") or os.environ.get("TFSCALE_LOCAL_RANK", "0"))
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})


def per_call_ms(fn: Callable[[], Any], calls: int, warmup: int) -> float:
    for _ in range(warmup):
        fn()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    return (time.perf_counter() - start) / calls * 1000


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--model", default="mlp")
    parser.add_argument("--image_size", type=int, default=32)
    parser.add_argument("--model_dir", required=True)
    parser.add_argument("--node_exchange", default="auto")
    args = parser.parse_args()
    bind_to_own_core()

    import keras
    import numpy as np
    import tensorflow as tf

    import models
    from tfscale.config.train_config import TrainConfig
    from tfscale.strategies import create, running
    from tfscale.training.losses import build_loss
    from tfscale.training.metrics import build_metrics
    from tfscale.training.optimizers import build_optimizer
    from tfscale.training.trainer import configure_runtime

    cfg = TrainConfig(model=args.model, strategy=args.strategy, batch_size=args.batch_size,
                      image_size=args.image_size, num_classes=10, intra_op_threads=1,
                      inter_op_threads=1, model_dir=args.model_dir,
                      node_exchange=args.node_exchange)
    configure_runtime(cfg)
    horovod_based = args.strategy in ("horovod", "ddl")
    task = models.task_of(args.model)
    with running(create(cfg)) as strategy:
        rng = np.random.default_rng(strategy.rank)
        batch = strategy.replicas_in_process * args.batch_size
        x = rng.random((batch, args.image_size, args.image_size, 3), dtype=np.float32)
        y = rng.integers(0, 10, batch).astype(np.int32)
        data = tf.data.Dataset.from_tensors((x, y)).repeat()

        def step_fn(model: keras.Model, dataset: tf.data.Dataset) -> Callable[[], float]:
            iterator = iter(dataset)
            model.make_train_function()
            function = model.train_function
            return lambda: float(function(iterator)["loss"])

        def compiled(optimizer: keras.optimizers.Optimizer) -> keras.Model:
            # As tfscale.training.trainer compiles it: its loss and metrics, and its optimizer
            # (SGD with momentum 0.9 by default).
            model = models.MODELS.get(args.model)(cfg)
            model.compile(optimizer=optimizer, loss=build_loss(cfg, task),
                          metrics=build_metrics(cfg, task))
            return model

        def sgd() -> keras.optimizers.Optimizer:
            return build_optimizer(cfg, strategy.num_replicas, args.steps)

        times: dict[str, float] = {}
        warm = max(10, args.steps // 10)
        local = compiled(sgd())  # no strategy scope, no exchange
        times["compute"] = per_call_ms(step_fn(local, data), args.steps, warm)
        with strategy.scope():
            model = compiled(strategy.wrap_optimizer(sgd()))
        strategy.prepare_model(model)
        times["step"] = per_call_ms(step_fn(model, strategy.distribute_dataset(data)),
                                    args.steps, warm)
        if horovod_based:
            strategy.config = strategy.settings(cfg.replace(gradient_lag=1))  # wrap_optimizer's
            model_lag = compiled(strategy.wrap_optimizer(sgd()))
            strategy.config = strategy.settings(cfg)
            times["step_lag"] = per_call_ms(
                step_fn(model_lag, strategy.distribute_dataset(data)), args.steps, warm)
        shapes = [w.shape for w in model.trainable_weights]
        tensors = [tf.ones(s) for s in shapes]
        megabytes = sum(int(np.prod(s)) for s in shapes) * 4 / 1e6
        own = getattr(strategy, "reduce", None)
        if own is not None:  # the strategy's own all-reduce (ddl's, or shared memory)
            reduce = tf.function(lambda ts: own(ts))
        elif horovod_based:
            hvd = strategy.comm.hvd  # type: ignore[attr-defined]
            reduce = tf.function(lambda ts: hvd.grouped_allreduce(ts, op=hvd.Average))
        else:
            tf_strategy = strategy.tf_strategy  # type: ignore[attr-defined]

            @tf.function
            def reduce(ts: list[tf.Tensor]) -> Any:
                def replica_fn(values: list[tf.Tensor]) -> Any:
                    ctx = tf.distribute.get_replica_context()
                    # Values computed in the replica: MultiWorkerMirroredStrategy finds no
                    # destination for the function's inputs themselves.
                    return ctx.all_reduce(tf.distribute.ReduceOp.MEAN, [v * 1.0 for v in values])
                return tf_strategy.run(replica_fn, args=(ts,))

        times["allreduce"] = per_call_ms(
            lambda: [t.numpy() for t in tf.nest.flatten(reduce(tensors))][:1], args.steps, warm)
        times["host_allreduce"] = per_call_ms(lambda: strategy.all_reduce([0.0, 0.0], "max"),
                                              args.steps, warm)
        times["read_step"] = per_call_ms(lambda: int(model.optimizer.iterations.numpy()),
                                         args.steps, warm)
        if strategy.rank == 0:
            print("BREAKDOWN " + json.dumps({"workers": strategy.size,
                                             "gradient_megabytes": megabytes, **times}),
                  flush=True)


if __name__ == "__main__":
    main()
