"""The exchange and the momentum update of ``mlp``'s gradients, sharded or not, between two
processes (issue 40, item 1).

Two processes, a core each, run a compiled function over and over with a step's time of
busy work between calls (as training leaves it), on ``mlp``'s 9.4 MB of float32 gradients
(``bench.exchange_efficiency``'s shapes):

- ``unsharded``: the node's all-reduce (:func:`tfscale.exchange.hierarchical.native_all_reduce`,
  a sum, views of the results) and then the fused SGD update of every weight, as each worker
  ran its step before :mod:`tfscale.exchange.sharded_update`;
- ``sharded``: the one op that sums this process's chunk, updates that chunk of the weights and
  momentum in the segment's weights region, where the variables keep the weights
  (``tfscale.train``'s default now);
- ``update``: the fused update of every weight, no exchange, in both processes at once (what
  one process's step spends on it, beside a twin).

The cases run in the same two processes, call by call in turn (this VM's memory moves by a
third within minutes, so cases timed minutes apart differ by more than sharding saves), each
round in a fresh pair; a case's time in a round is the median call of the slower process,
and the saving is the median over the rounds of unsharded - sharded in the same round. A
call into a ``tf.function`` from Python costs the same in every case and is left in. The
saving is what each worker's step loses; over a step's time, what it adds to the two-worker
efficiency.

    python -m bench.sharded_update [--rounds 5 --calls 200 --gap_ms 8]
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import time
from typing import Any

from bench.common import cpu_description, save, table
from bench.exchange_efficiency import MLP_SHAPES

CASES = ("unsharded", "sharded", "update")


def _worker(index: int, core: int, key: str, gap_ms: float, calls: int, out: Any) -> None:
    import numpy as np
    import tensorflow as tf

    from tfscale.exchange import sharded_update
    from tfscale.exchange.hierarchical import HierarchicalAllReduce, native_all_reduce
    from tfscale.exchange.shared_memory import SharedMemoryGroup
    from tfscale.training.optimizers.sgd import SGD

    os.sched_setaffinity(0, {core})
    tf.config.threading.set_intra_op_parallelism_threads(1)
    tf.config.threading.set_inter_op_parallelism_threads(1)
    rng = np.random.default_rng(index)
    grads = [tf.constant(rng.standard_normal(s).astype(np.float32)) for s in MLP_SHAPES]
    group = SharedMemoryGroup(key, index, 2, timeout_s=120)
    reduce = HierarchicalAllReduce.on_one_node(group, transient=True)
    functions = {}
    for case in CASES:  # each with weights and momentum of its own
        weights = [tf.Variable(np.zeros(s, np.float32)) for s in MLP_SHAPES]
        optimizer = SGD(learning_rate=0.01, momentum=0.9)
        optimizer.build(weights)
        if case == "update":
            function = tf.function(functools.partial(optimizer.apply, grads, weights))
        elif case == "unsharded":
            function = tf.function(lambda o=optimizer, w=weights: o.apply(
                native_all_reduce(group, grads, 1, False, "sums"), w))
        else:
            function = tf.function(lambda o=optimizer, w=weights: sharded_update.apply(
                o, reduce, grads, w, o.learning_rate))
        function()
        functions[case] = function
    times: dict[str, list[float]] = {case: [] for case in CASES}
    for call in range(calls + 20):
        for case in CASES:  # the same order in both processes: the exchanges pair up
            end = time.perf_counter() + gap_ms / 1000.0
            while time.perf_counter() < end:  # the step's work: the core busy, memory idle
                pass
            start = time.perf_counter()
            functions[case]()
            if call >= 20:
                times[case].append(time.perf_counter() - start)
    out.put({case: statistics.median(t) * 1000.0 for case, t in times.items()})


def time_round(cores: list[int], gap_ms: float, calls: int) -> dict[str, float]:
    """Each case's median call in ms, the slower of two processes on ``cores``."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    key = f"sharded{os.getpid()}-{time.monotonic_ns()}"
    procs = [context.Process(target=_worker, args=(i, cores[i], key, gap_ms, calls, out))
             for i in range(2)]
    for p in procs:
        p.start()
    try:
        got = [out.get(timeout=600) for _ in procs]
        return {case: max(float(g[case]) for g in got) for case in CASES}
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


def measure(rounds: int, calls: int, gap_ms: float) -> dict[str, Any]:
    cores = sorted(os.sched_getaffinity(0))[:2]
    if len(cores) < 2:
        raise SystemExit("bench.sharded_update needs two cores")
    runs: dict[str, list[float]] = {case: [] for case in CASES}
    for _ in range(rounds):
        for case, ms in time_round(cores, gap_ms, calls).items():
            runs[case].append(ms)
    medians = {case: statistics.median(v) for case, v in runs.items()}
    savings = [u - s for u, s in zip(runs["unsharded"], runs["sharded"], strict=True)]
    return {"cpu": cpu_description(), "rounds": rounds, "calls": calls, "gap_ms": gap_ms,
            "runs": runs, "medians_ms": medians, "saving_ms": statistics.median(savings),
            "saving_range_ms": [min(savings), max(savings)]}


def report(result: dict[str, Any]) -> str:
    rows = [{"case": case, "ms a call (median of rounds)": result["medians_ms"][case],
             "per round": ", ".join(f"{t:.2f}" for t in result["runs"][case])}
            for case in CASES]
    lo, hi = result["saving_range_ms"]
    return "\n".join([
        f"CPU: {result['cpu']}; {result['rounds']} rounds of {result['calls']} calls, "
        f"{result['gap_ms']} ms of work between calls",
        "",
        table(rows, ["case", "ms a call (median of rounds)", "per round"]),
        "",
        f"sharding saves {result['saving_ms']:.2f} ms a step (median of the rounds' "
        f"differences; {lo:.2f} to {hi:.2f})",
    ])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200, help="calls of each case a round")
    parser.add_argument("--gap_ms", type=float, default=8.0,
                        help="busy work between calls: about one mlp step on one core")
    args = parser.parse_args()
    result = measure(args.rounds, args.calls, args.gap_ms)
    save("sharded_update", result)
    print(report(result))


if __name__ == "__main__":
    main()
