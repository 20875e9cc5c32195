"""One rank of bench.call_in_step, started by ``srun --mpi=pmix`` on the mini-cluster.

Times, per iteration, on every rank at once: Horovod's grouped all-reduce of mlp's gradients
alone (``call``: summed, back to back, as bench.shaped_links times it, here at the cycle the
driver sets); a plain Keras training step of mlp alone (``step``: forward, backward and SGD with
momentum in one ``tf.function``, no exchange); that step with the grouped all-reduce of its
gradients inside it, averaged as tfscale's reduction does (the sum of the gradients of a loss
divided by the ranks), before the update (``step+call``:
what a flat Horovod run of tfscale.train does in each step, without Keras' fit, tfscale's
callbacks or its optimizer wrapper); and, as a control, a chain of matrix products as long as
the step (``chain``, its length agreed from rank 0's timing of the step) alone and with the
same call after it (``chain+call``). Modes alternate within each round, in order in the first
round and reversed in the next. Rank 0 prints one JSON line: ms per iteration of each mode,
one figure per round, and under ``core_ms`` how its node's core spent each iteration of each
mode (user, system, softirq and idle time from ``/proc/stat``, in ms; the node's ranks share
that core): whether the ranks' waits in the exchange occupy it (Open MPI polls) or leave it
idle (Gloo blocks).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

from bench.common import CORE_FIELDS, core_times, in_round_order  # noqa: E402
from models.small import mlp  # noqa: E402

MODES = ("call", "step", "step+call", "chain", "chain+call")
IMAGE_SIZE, BATCH, CLASSES = 32, 64, 1000  # bench.shaped_links' mlp runs
WIDTH = 1024  # the control's matrices: a batch of 64 rows times WIDTH x WIDTH


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.iterations < 1 or args.rounds < 1:
        parser.error(f"--iterations={args.iterations} --rounds={args.rounds}: expected "
                     "whole numbers >= 1")
    return args


def _node_core() -> dict[str, float]:
    with open("/proc/stat", encoding="ascii") as stat:
        return core_times(stat.read(), os.sched_getaffinity(0))


def _per_iteration(run: Callable[[], object], iterations: int,
                   core: dict[str, float] | None = None) -> float:
    """ms per iteration of ``run``, every rank starting together; with ``core``, adds there
    the ms per iteration that this rank's core spent in each of :data:`CORE_FIELDS`."""
    hvd.allreduce(tf.zeros(1), name="barrier").numpy()
    before = _node_core()
    start = time.perf_counter()
    for _ in range(iterations):
        run()
    elapsed = time.perf_counter() - start
    if core is not None:
        after = _node_core()
        core.update({field: round((after[field] - before[field]) / iterations * 1e3, 1)
                     for field in CORE_FIELDS})
    return elapsed / iterations * 1e3


def main() -> None:
    args = _arguments()
    hvd.init()
    model = mlp((IMAGE_SIZE, IMAGE_SIZE, 3), CLASSES)
    optimizer = keras.optimizers.SGD(0.01, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    images = tf.random.uniform((BATCH, IMAGE_SIZE, IMAGE_SIZE, 3), seed=hvd.rank())
    labels = tf.random.uniform((BATCH,), maxval=CLASSES, dtype=tf.int32, seed=hvd.rank())
    gradients = [tf.ones(v.shape) for v in model.trainable_variables]

    def make_step(exchange: bool) -> Callable[[], object]:
        @tf.function
        def step() -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = loss_fn(labels, model(images, training=True))
                if exchange:  # the mean as tfscale's reduction makes it
                    loss = loss / hvd.size()
            grads = tape.gradient(loss, model.trainable_variables)
            if exchange:
                grads = hvd.grouped_allreduce(grads, op=hvd.Sum, name="step")
            optimizer.apply(grads, model.trainable_variables)
            return loss

        return lambda: step().numpy()

    def call() -> object:
        return [t.numpy() for t in hvd.grouped_allreduce(gradients, op=hvd.Sum, name="call")]

    runs: dict[str, Callable[[], object]] = {"call": call, "step": make_step(False),
                                             "step+call": make_step(True)}
    for run in runs.values():
        run()
    # The control's length: as many products as take rank 0 as long as its step.
    a = tf.random.uniform((BATCH, WIDTH))
    w = tf.random.uniform((WIDTH, WIDTH), maxval=1e-3)

    @tf.function
    def chain(count: tf.Tensor) -> tf.Tensor:
        x = a
        for _ in tf.range(count):
            x = tf.tanh(tf.matmul(x, w))
        return tf.reduce_sum(x)

    chain(tf.constant(1)).numpy()  # traced once, for every count
    one = _per_iteration(lambda: chain(tf.constant(10)).numpy(), 5) / 10
    step_ms = _per_iteration(runs["step"], 5)
    count = int(hvd.broadcast(tf.constant(max(1, round(step_ms / one))), 0, name="count"))
    runs["chain"] = lambda: chain(tf.constant(count)).numpy()
    runs["chain+call"] = lambda: (runs["chain"](), call())
    ms: dict[str, list[float]] = {mode: [] for mode in MODES}
    core_ms: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
    for round_ in range(args.rounds):
        for mode in in_round_order(MODES, round_):
            core: dict[str, float] = {}
            ms[mode].append(round(_per_iteration(runs[mode], args.iterations, core), 2))
            core_ms[mode].append(core)
    if hvd.rank() == 0:
        print(json.dumps({"ranks": hvd.size(), "nodes": hvd.cross_size(),
                          "chain_products": count, "ms": ms, "core_ms": core_ms}), flush=True)
    hvd.allreduce(tf.zeros(1), name="done").numpy()


if __name__ == "__main__":
    main()
