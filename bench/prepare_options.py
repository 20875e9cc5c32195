"""What each ``tfscale.prepare()`` option costs per step, on a small model, in a user's script.

Run under two Horovod workers (each pinned to its core by tfscale-run); every option is a fresh
model and ``prepare()`` call in the same processes, in alternating order over the rounds
(:func:`bench.common.in_round_order`). The step time is the median over the timed steps of the
slowest worker (the first steps, which trace, are left out). The model: 3 blocks of a 3x3
convolution (32 channels), batch norm and ReLU on 32x32x3 inputs, batch 32 per worker, SGD.

    python -m tfscale.run --nproc=2 --strategy=horovod -m bench.prepare_options [--rounds 3]

Rank 0 prints the table and writes ``bench/results/prepare_options.json``. Not measured here:
``precision`` (Keras's dtype policy is process-wide, so it needs a process per setting; see
docs/MIGRATING.md for what mixed precision did on this project's CPUs).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import keras
import numpy as np
import tensorflow as tf

import tfscale
from bench.common import cpu_description, in_round_order, save, table

OPTIONS: dict[str, dict[str, Any]] = {
    "none": {},
    "grad_accum_steps=2": {"grad_accum_steps": 2},
    "sync_bn=True": {"sync_bn": True},
    "recompute=<3 blocks>": {"recompute": lambda name: name.split("_")[0]
                             if name.startswith("block") else None},
    "gradient_lag=1": {"gradient_lag": 1},
}


def build() -> keras.Model:
    inputs = keras.Input((32, 32, 3))
    x = inputs
    for i in range(1, 4):
        x = keras.layers.Conv2D(32, 3, padding="same", name=f"block{i}_conv")(x)
        x = keras.layers.BatchNormalization(name=f"block{i}_bn")(x)
        x = keras.layers.ReLU(name=f"block{i}_relu")(x)
    x = keras.layers.GlobalAveragePooling2D()(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x))


class StepTimes(keras.callbacks.Callback):
    def __init__(self) -> None:
        super().__init__()
        self.times: list[float] = []

    def on_train_batch_begin(self, batch: int, logs: Any = None) -> None:
        self.start = time.perf_counter()

    def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
        self.times.append(time.perf_counter() - self.start)


def step_ms(options: dict[str, Any], data: tf.data.Dataset, warmup: int, steps: int) -> float:
    keras.utils.set_random_seed(0)
    model, optimizer, callbacks = tfscale.prepare(build(), keras.optimizers.SGD(0.01),
                                                  **options)
    model.compile(optimizer=optimizer,
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    meter = StepTimes()
    model.fit(data, steps_per_epoch=warmup + steps, epochs=1, verbose=0,
              callbacks=[*callbacks, meter])
    mine = statistics.median(meter.times[warmup:]) * 1000
    return float(tfscale.setup().all_reduce([mine], "max")[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    strategy = tfscale.setup(sync_bn=True)  # Horovod's cycle time for sync_bn, for all options
    rng = np.random.default_rng(strategy.rank)
    data = tf.data.Dataset.from_tensor_slices(
        (rng.random((4, 32, 32, 32, 3), dtype=np.float32),
         rng.integers(0, 10, (4, 32)))).repeat()
    times: dict[str, list[float]] = {name: [] for name in OPTIONS}
    for round_ in range(args.rounds):
        for name in in_round_order(list(OPTIONS), round_):
            times[name].append(step_ms(OPTIONS[name], data, args.warmup, args.steps))
    if strategy.is_chief:
        base = statistics.median(times["none"])
        rows = [{"option": name, "step ms per round": " ".join(f"{t:.1f}" for t in values),
                 "median ms": f"{statistics.median(values):.1f}",
                 "vs none": f"{statistics.median(values) / base:.2f}"}
                for name, values in times.items()]
        print(table(rows, ["option", "step ms per round", "median ms", "vs none"]))
        print(cpu_description())
        save("prepare_options", {"workers": strategy.size, "cpu": cpu_description(),
                                 "step_ms": times, "rounds": args.rounds})


if __name__ == "__main__":
    main()
