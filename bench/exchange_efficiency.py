"""Two-worker efficiency of ``mlp`` against the floors this machine sets (issue 40, item 1).

``mlp`` at batch 64 per worker is communication-bound: 9.4 MB of gradients (32 px, 1000
classes) for a step of about 10 milliseconds on one core. Each round runs, in alternating order:

- ``alone``: one process of ``tfscale.train`` on one core, the baseline;
- ``twin``: two such processes at once, one per core, exchanging nothing: what running two
  workers side by side costs before any exchange (shared memory bandwidth, caches, clock);
- each strategy on 2 workers (``--num_processes=2 --cpu_binding``: a core each);
- with ``--numpy_function``, each strategy again with its exchange in ``tf.numpy_function``
  (``TFSCALE_NATIVE_EXCHANGE=0``) instead of :mod:`tfscale.exchange.native`'s op: what the op
  gains, in the same rounds;
- with ``--unsharded``, each strategy again with ``--nosharded_update`` (every worker applies
  the whole momentum update, as before :mod:`tfscale.exchange.sharded_update`): what sharding
  the update gains, in the same rounds.

Efficiency = the 2-worker rate / (2 x ``alone``). Two floors bound it from above:

- the twin floor, the twins' rate / (2 x ``alone``): no exchange can do better;
- the copy floor: the twin floor x step / (step + the shared-memory exchange's least time),
  that time being the bytes it must move at this machine's copy rate (every worker copies the
  half of its gradients that its peer sums into shared memory and sums its own half of both:
  2 x the gradient bytes through memory, measured as ``bench.common.memcpy_gbps`` measures a
  copy).

- the bare-exchange floor: the twin floor x step / (step + the shared-memory all-reduce of the
  same tensors alone), timed between two processes, a core each, with a step's time of work
  between calls as in training (memory that has sat idle for a step is slower to reach than
  the copy rate's, which is measured back to back), through the segment's protocol as
  training runs it (:mod:`tfscale.exchange.native`'s op in a ``tf.function``, or NumPy where
  the op does not load): no exchange of these bytes through
  :class:`tfscale.exchange.shared_memory.SharedMemoryGroup`'s segment can do better.

The fraction of the floors a strategy reaches is what the exchange still costs above its
least. The floors keep each worker's step as one process runs it, the whole update included;
a sharded update (the strategies' default) takes half of the update off each of two workers'
steps, so it can pass them. Figures are medians over ``--rounds``.

    python -m bench.exchange_efficiency [--rounds 3 --steps 300 --strategies horovod,multiworker]
                                        [--numpy_function] [--unsharded]
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import statistics
import threading
import time
from typing import Any

from bench.common import cpu_description, in_round_order, memcpy_gbps, save, table, train

TARGET = 0.85
MLP = ["--model=mlp", "--image_size=32", "--batch_size=64", "--learning_rate=0.01"]
# mlp's weights at 32 px, 3 channels, width 512 and 1000 classes (models.small.mlp), in order.
MLP_SHAPES = ((32 * 32 * 3, 512), (512,), (512, 512), (512,), (512, 1000), (1000,))
GRADIENT_MB = sum(math.prod(shape) for shape in MLP_SHAPES) * 4 / 1e6


def _bare_worker(index: int, core: int, key: str, gap_ms: float, calls: int,
                 out: Any, module: str | None = None, divisor: int = 1,
                 native_op: bool = False) -> None:
    import numpy as np

    if module is None:
        from tfscale.exchange import shared_memory
    else:  # another version of the module, from its file (bench.shared_memory_ab)
        import importlib.util

        spec = importlib.util.spec_from_file_location("shared_memory_under_test", module)
        assert spec is not None and spec.loader is not None
        shared_memory = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(shared_memory)

    os.sched_setaffinity(0, {core})
    group = shared_memory.SharedMemoryGroup(key, index, 2, timeout_s=120)
    rng = np.random.default_rng(index)
    tensors = [rng.standard_normal(shape).astype(np.float32) for shape in MLP_SHAPES]
    exchange = functools.partial(group.all_reduce, *tensors, divisor=divisor, copy=False)
    empty = None
    if module is None and native_op:
        # As training runs it: tfscale.exchange.native's op in a compiled function.
        import tensorflow as tf

        from tfscale.exchange.hierarchical import native_all_reduce

        values = [tf.constant(t) for t in tensors]
        op = tf.function(lambda: native_all_reduce(group, values, divisor, False, "bare"))
        op()
        exchange = op
        # In training the op runs inside the step; here each call also pays for calling a
        # tf.function from Python, timed apart on one that returns the same tensors unchanged.
        empty = tf.function(lambda: [tf.identity(v) for v in values])
        empty()
    times, empties = [], []
    for call in range(calls + 20):
        end = time.perf_counter() + gap_ms / 1000.0
        while time.perf_counter() < end:  # the step's work: the core busy, memory left idle
            pass
        start = time.perf_counter()
        exchange()
        if call >= 20:
            times.append(time.perf_counter() - start)
        if empty is not None:
            start = time.perf_counter()
            empty()
            empties.append(time.perf_counter() - start)
    called = statistics.median(empties) if empties else 0.0
    out.put((statistics.median(times) - called) * 1000.0)


def bare_exchange_ms(cores: list[int], gap_ms: float, calls: int = 200,
                     module: str | None = None, divisor: int = 1,
                     native_op: bool = False) -> float:
    """The shared-memory all-reduce of mlp's gradients between two processes on ``cores``,
    ``gap_ms`` of work between calls: its median time, the slower process's (``module``: the
    file of another version of :mod:`tfscale.exchange.shared_memory` to time instead;
    ``native_op``: through :mod:`tfscale.exchange.native`'s op, in a ``tf.function``).
    ``divisor`` 1, a sum, is what both strategies run: horovod's mean comes from a loss
    divided by the workers (:func:`tfscale.exchange.optimizer.with_gradient_reduction`)."""
    import multiprocessing

    context = multiprocessing.get_context("spawn")
    out = context.Queue()
    key = f"bench{os.getpid()}-{time.monotonic_ns()}"
    procs = [context.Process(target=_bare_worker,
                             args=(i, cores[i], key, gap_ms, calls, out, module,
                                   divisor, native_op))
             for i in range(2)]
    for p in procs:
        p.start()
    try:
        return max(float(out.get(timeout=300)) for _ in procs)
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


def twins(flags: list[str], cores: list[int]) -> list[float]:
    """Two independent one-process runs at once, each on its own core: their images/s."""
    rates: list[float] = [0.0, 0.0]
    errors: list[BaseException] = []

    def one(i: int) -> None:
        try:
            rates[i] = float(train(flags, cores=[cores[i]])["images_per_sec"])
        except BaseException as err:  # reported after both have ended
            errors.append(err)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise errors[0]
    return rates


# The suffixes of a strategy's cases that run it another way: the exchange in
# tf.numpy_function, not as the op; every worker applying the whole update (--nosharded_update).
IN_PYTHON = " (numpy_function)"
UNSHARDED = " (unsharded update)"
VARIANTS = {IN_PYTHON: ([], {"TFSCALE_NATIVE_EXCHANGE": "0"}),
            UNSHARDED: (["--nosharded_update"], {})}


def measure(strategies: list[str], rounds: int, steps: int, numpy_function: bool = False,
            unsharded: bool = False) -> dict[str, Any]:
    cores = sorted(os.sched_getaffinity(0))[:2]
    base = [*MLP, f"--steps={steps}", f"--log_every={steps}"]
    plain = list(strategies)
    for suffix, wanted in ((IN_PYTHON, numpy_function), (UNSHARDED, unsharded)):
        if wanted:
            strategies = [*strategies, *(s + suffix for s in plain)]
    cases = ["alone", "twin", *strategies]
    runs: dict[str, list[float]] = {case: [] for case in cases}
    for round_ in range(rounds):
        for case in in_round_order(cases, round_):
            if case == "alone":
                runs[case].append(float(train([*base, "--strategy=default"],
                                              cores=cores[:1])["images_per_sec"]))
            elif case == "twin":
                runs[case].append(sum(twins([*base, "--strategy=default"], cores)))
            else:
                strategy, suffix = case.split(" ", 1) if " " in case else (case, "")
                flags, env = VARIANTS.get(" " + suffix, ([], {}))
                runs[case].append(float(train([*base, f"--strategy={strategy}",
                                               "--num_processes=2", "--cpu_binding", *flags],
                                              env={"TFSCALE_NATIVE_EXCHANGE": "1", **env}
                                              )["images_per_sec"]))
    copy_gbps = memcpy_gbps()
    alone = statistics.median(runs["alone"])
    twin_floor = statistics.median(runs["twin"]) / (2 * alone)
    step_ms = 64 * 1000.0 / alone
    least_ms = 2 * GRADIENT_MB * 1e6 / (copy_gbps * 1e9) * 1000.0
    copy_floor = twin_floor * step_ms / (step_ms + least_ms)
    # The exchange as the strategies run it: the op where it loads, else in NumPy.
    from tfscale.exchange import native

    op = native.library() is not None
    bare_ms = bare_exchange_ms(cores, step_ms, native_op=op)
    bare_floor = twin_floor * step_ms / (step_ms + bare_ms)
    rows = []
    for case in strategies:
        effs = [two / (2 * one) for two, one in zip(runs[case], runs["alone"], strict=True)]
        eff = statistics.median(runs[case]) / (2 * alone)
        rows.append({"strategy": case, "2 workers images/s": statistics.median(runs[case]),
                     "efficiency": eff, "range": f"{min(effs):.3f}-{max(effs):.3f}",
                     "of the copy floor": eff / copy_floor,
                     "of the bare-exchange floor": eff / bare_floor, "met": eff >= TARGET})
    return {"cpu": cpu_description(), "rounds": rounds, "steps": steps, "runs": runs,
            "alone_images_per_sec": alone, "step_ms": step_ms, "copy_gbps": copy_gbps,
            "least_exchange_ms": least_ms, "twin_floor": twin_floor, "copy_floor": copy_floor,
            "gradient_mb": GRADIENT_MB, "bare_exchange_ms": bare_ms, "bare_floor": bare_floor,
            "bare_exchange": "the op" if op else "NumPy (tf.numpy_function's body)",
            "rows": rows, "target": TARGET}


def report(result: dict[str, Any]) -> str:
    return "\n".join([
        f"CPU: {result['cpu']}; {result['rounds']} rounds of {result['steps']} steps",
        f"one process alone: {result['alone_images_per_sec']:.0f} images/s "
        f"({result['step_ms']:.2f} ms a step)",
        f"twin floor (two processes side by side, no exchange): {result['twin_floor']:.3f}",
        f"copy floor: {result['gradient_mb']:.1f} MB of gradients, copy rate "
        f"{result['copy_gbps']:.1f} GB/s, least exchange {result['least_exchange_ms']:.2f} ms "
        f"-> {result['copy_floor']:.3f}",
        f"bare-exchange floor: the shared-memory all-reduce alone "
        f"({result.get('bare_exchange', 'NumPy')}), a step's work between calls, "
        f"{result['bare_exchange_ms']:.2f} ms -> {result['bare_floor']:.3f}",
        "",
        table(result["rows"], ["strategy", "2 workers images/s", "efficiency", "range",
                               "of the copy floor", "of the bare-exchange floor", "met"]),
        "",
        f"Target: efficiency >= {result['target']} (median of the rounds; each round's "
        "efficiency against that round's one-process run in the range).",
    ])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategies", default="horovod,multiworker")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--numpy_function", action="store_true",
                        help="each strategy also with its exchange in tf.numpy_function")
    parser.add_argument("--unsharded", action="store_true",
                        help="each strategy also with every worker applying the whole update "
                             "(--nosharded_update)")
    args = parser.parse_args()
    result = measure(args.strategies.split(","), args.rounds, args.steps, args.numpy_function,
                     args.unsharded)
    save("exchange_efficiency", result)
    print(report(result))


if __name__ == "__main__":
    main()
