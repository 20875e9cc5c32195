"""Worker for the strategy-equivalence tests.

Trains ``tiny_cnn`` (no batch norm) with plain SGD for ``--steps`` steps under ``--strategy``,
on fixed data: step ``i``'s global batch is the same whatever the strategy (and however the
steps are split into ``--epochs``), and each replica reads its own contiguous slice of it.
Workers start from different random weights (seed + rank), so identical results also prove the
initial broadcast. Each process writes its final weights to ``OUT/rank<R>.npz``, and to
``OUT/rank<R>.json`` what its training steps ran: forward passes, the largest batch one of them
saw, and (Horovod) grouped all-reduces.

With ``--grad_accum_steps K`` a step is K micro-batches of ``--batch`` per replica
(:func:`tfscale.training.optimizers.accumulate_gradients`). With ``--momentum``, SGD has that
momentum (the update that ``horovod`` and ``multiworker`` shard over a node's workers,
:mod:`tfscale.exchange.sharded_update`), and each process also writes its momentum, gathered as
a checkpoint gathers it, to ``OUT/rank<R>_momentum.npz``; ``sharded`` in the counts is the
number of steps whose update was sharded.

    python -m tests.workers.equivalence --strategy horovod --steps 1 --batch 4 --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfscale.cli.command import import_tensorflow  # noqa: E402

import_tensorflow()  # Keras without matplotlib (tests/workers/__init__.py)

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from models.small import tiny_cnn  # noqa: E402
from tfscale.cli.command import skip_the_last_collection  # noqa: E402
from tfscale.config.train_config import TrainConfig  # noqa: E402
from tfscale.strategies import create, running  # noqa: E402
from tfscale.training.optimizers import accumulate_gradients  # noqa: E402
from tfscale.training.trainer import configure_runtime  # noqa: E402

SHAPE, CLASSES = (8, 8, 3), 3


def global_batches(steps: int, global_batch: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(1234)
    x = rng.random((steps, global_batch, *SHAPE), dtype=np.float32)
    y = rng.integers(0, CLASSES, (steps, global_batch)).astype(np.int32)
    return x, y


class Counts:
    """Counters that the training function itself increments (so they count executions, not
    traces); created outside the strategy's scope, so every process keeps its own."""

    def __init__(self) -> None:
        self.values = {name: tf.Variable(0, dtype=tf.int64, trainable=False)
                       for name in ("forward_passes", "largest_forward_batch", "allreduces",
                             "sharded")}
        self.divisors: set[int] = set()
        self.horovod_ops: set[str] = set()  # the ops of Horovod's grouped all-reduces, traced

    def count_forward(self, model: keras.Model) -> None:
        call = model.call

        def counted(inputs, *args, **kwargs):  # type: ignore[no-untyped-def]
            self.values["forward_passes"].assign_add(1)
            batch = tf.cast(tf.shape(inputs)[0], tf.int64)
            self.values["largest_forward_batch"].assign(
                tf.maximum(self.values["largest_forward_batch"], batch))
            return call(inputs, *args, **kwargs)

        model.call = counted

    def count_allreduces(self, strategy) -> None:  # type: ignore[no-untyped-def]
        """Counts the gradient all-reduces: Horovod's grouped ones, or the shared-memory
        exchange's: its op's (a counter the step increments beside it) or, where the exchange
        runs in tf.numpy_function, its NumPy function's (which runs once per execution); and
        the sharded momentum's gathers."""
        node = getattr(getattr(strategy, "reduce", None), "node", None)
        if node is not None:
            from tfscale.exchange import hierarchical, sharded_update

            apply = sharded_update.apply

            def counted_sharded(*args, **kwargs):  # type: ignore[no-untyped-def]
                done = apply(*args, **kwargs)
                if done is not None:
                    self.values["allreduces"].assign_add(1)
                    self.values["sharded"].assign_add(1)
                    self.divisors.add(int(kwargs.get("divisor", 1)))
                return done

            sharded_update.apply = counted_sharded
            gather = sharded_update.gather_momentum

            def counted_gather(optimizer):  # type: ignore[no-untyped-def]
                # One exchange on each segment that a step sharded the momentum on.
                self.exchanges += len(getattr(optimizer, "_tfscale_sharded_momentum", {}))
                return gather(optimizer)

            sharded_update.gather_momentum = counted_gather

            exchange, native = node.all_reduce, hierarchical.native_all_reduce

            def counted_op(node, values, divisor, copy, name):  # type: ignore[no-untyped-def]
                outs = native(node, values, divisor, copy, name)
                if outs is not None:
                    self.values["allreduces"].assign_add(1)
                    self.divisors.add(int(divisor))
                return outs

            hierarchical.native_all_reduce = counted_op

            def counted_exchange(*args, **kwargs):  # type: ignore[no-untyped-def]
                self.exchanges += 1
                self.divisors.add(int(kwargs.get("divisor", 1)))
                return exchange(*args, **kwargs)

            node.all_reduce = counted_exchange
            return
        if not hasattr(strategy, "comm"):
            return
        hvd = strategy.comm.hvd
        grouped = hvd.grouped_allreduce

        def counted(*args, **kwargs):  # type: ignore[no-untyped-def]
            self.values["allreduces"].assign_add(1)
            op = kwargs.get("op")
            self.horovod_ops.add("Sum" if op == hvd.Sum else "Average" if op == hvd.Average
                                 else repr(op))
            return grouped(*args, **kwargs)

        hvd.grouped_allreduce = counted

    exchanges = 0

    def to_dict(self) -> dict[str, Any]:
        counts: dict[str, Any] = {name: int(v.numpy()) for name, v in self.values.items()}
        counts["allreduces"] += self.exchanges
        # The shared-memory exchange's divisors: [1] where the step sums (the mean then comes
        # from a divided loss), [workers] where the exchange divides.
        counts["exchange_divisors"] = sorted(self.divisors)
        counts["horovod_ops"] = sorted(self.horovod_ops)
        return counts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", required=True)
    parser.add_argument("--steps", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=1,
                        help="split the steps over this many epochs of model.fit")
    parser.add_argument("--batch", type=int, default=4, help="per-replica batch")
    parser.add_argument("--cpu_replicas", type=int, default=0)
    parser.add_argument("--ddl_local_size", type=int, default=0)
    parser.add_argument("--grad_accum_steps", type=int, default=1)
    parser.add_argument("--node_exchange", default="auto")
    parser.add_argument("--xla", default="off")
    parser.add_argument("--momentum", type=float, default=0.0)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    if args.steps % args.epochs:
        parser.error(f"--steps={args.steps} is not a multiple of --epochs={args.epochs}")
    cfg = TrainConfig(model="tiny_cnn", strategy=args.strategy, batch_size=args.batch,
                      image_size=SHAPE[0], input_channels=SHAPE[2], num_classes=CLASSES,
                      cpu_replicas=args.cpu_replicas, ddl_local_size=args.ddl_local_size,
                      grad_accum_steps=args.grad_accum_steps, model_dir=args.out,
                      node_exchange=args.node_exchange, xla=args.xla)
    configure_runtime(cfg)
    with running(create(cfg)) as strategy:
        micro = args.grad_accum_steps
        x, y = global_batches(args.steps, args.batch * strategy.num_replicas * micro)
        per_process = args.batch * strategy.replicas_in_process * micro
        lo = strategy.rank * per_process
        data = tf.data.Dataset.from_tensor_slices(
            (x[:, lo:lo + per_process], y[:, lo:lo + per_process]))
        keras.utils.set_random_seed(100 + strategy.rank)
        counts = Counts()
        counts.count_allreduces(strategy)
        with strategy.scope():
            model = tiny_cnn(SHAPE, CLASSES)
            optimizer = strategy.wrap_optimizer(keras.optimizers.SGD(0.5, args.momentum))
            model.compile(optimizer=optimizer,
                          loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                          jit_compile=strategy.jit_compiles == "step")
            accumulate_gradients(model, micro)
            strategy.prepare_model(model)
        counts.count_forward(model)
        history = model.fit(strategy.distribute_dataset(data), epochs=args.epochs,
                            steps_per_epoch=args.steps // args.epochs,
                            callbacks=strategy.callbacks(),
                            verbose=0, shuffle=False)
        Path(args.out).mkdir(parents=True, exist_ok=True)
        np.savez(Path(args.out) / f"rank{strategy.rank}.npz",
                 *[np.asarray(w) for w in model.get_weights()])
        if args.momentum:
            from tfscale.exchange.sharded_update import gather_momentum

            gather_momentum(optimizer)  # a collective, as before a checkpoint
            np.savez(Path(args.out) / f"rank{strategy.rank}_momentum.npz",
                     *[np.asarray(m.numpy()) for m in optimizer.momentums])
        (Path(args.out) / f"rank{strategy.rank}.json").write_text(
            json.dumps({**counts.to_dict(), "describe": strategy.describe(),
                        "loss": history.history["loss"][-1]}))


if __name__ == "__main__":
    main()
    skip_the_last_collection()  # a probe: exit without Python's last collection
