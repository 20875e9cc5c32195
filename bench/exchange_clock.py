"""What timing the exchange costs a training step: the step's own variables against a host
callback (issue 40, item 1: each of the two workers pays it every step).

One process, one core, one TensorFlow thread of each kind. Three compiled functions do the
same small update of a variable (the work between the timestamps); ``clock`` adds the elapsed
time to :data:`tfscale.exchange.timing.CLOCK` as a training step does, ``callback`` hands it to
Python through ``tf.numpy_function`` (how the clock worked before), ``none`` times nothing.
Each round times every variant over ``--calls`` calls, in order and reversed in turn; figures
are medians over the rounds of the microseconds per call, and the cost is that less ``none``'s.

    python -m bench.exchange_clock [--rounds 5 --calls 3000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

from bench.common import cpu_description, in_round_order, save, table

VARIANTS = ("none", "clock", "callback")


def functions() -> dict[str, Callable[[], Any]]:
    import numpy as np
    import tensorflow as tf

    from tfscale.exchange import timing

    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    timing.enable()
    weights = tf.Variable(tf.zeros((64, 512)))
    delta = tf.random.normal((64, 512))
    seen: list[float] = []

    def record(seconds: np.ndarray) -> np.ndarray:
        seen.append(float(seconds))
        return np.zeros((), np.float64)

    @tf.function
    def none() -> Any:
        return weights.assign_add(delta)

    @tf.function
    def clock() -> Any:
        started = timing.start([delta])
        out = weights.assign_add(delta)
        timing.stop(started, [out])
        return out

    @tf.function
    def callback() -> Any:
        started = tf.timestamp()
        out = weights.assign_add(delta)
        with tf.control_dependencies([out]):
            elapsed = tf.timestamp() - started
        tf.numpy_function(record, [elapsed], tf.float64, stateful=True)
        return out

    return {"none": none, "clock": clock, "callback": callback}


def measure(rounds: int, calls: int) -> dict[str, Any]:
    os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
    fns = functions()
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {v: [] for v in VARIANTS}
    for r in range(rounds):
        for v in in_round_order(VARIANTS, r):
            fn = fns[v]
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            times[v].append((time.perf_counter() - start) / calls * 1e6)
    from tfscale.exchange import timing

    seconds, steps = timing.CLOCK.take()
    if steps != rounds * calls + 1 or seconds <= 0:
        raise RuntimeError(f"the clock counted {steps} exchanges ({seconds} s); "
                           f"expected {rounds * calls + 1}")
    base = statistics.median(times["none"])
    rows = [{"variant": v, "us_per_call": statistics.median(times[v]),
             "range": f"{min(times[v]):.1f}-{max(times[v]):.1f}",
             "cost_us": statistics.median(times[v]) - base} for v in VARIANTS]
    return {"cpu": cpu_description(), "rounds": rounds, "calls": calls, "rows": rows}


def report(result: dict[str, Any]) -> str:
    return (f"CPU: {result['cpu']}; {result['rounds']} rounds of {result['calls']} calls\n\n"
            + table(result["rows"], ["variant", "us_per_call", "range", "cost_us"]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=3000)
    args = parser.parse_args()
    result = measure(args.rounds, args.calls)
    save("exchange_clock", result)
    print(report(result))


if __name__ == "__main__":
    main()
