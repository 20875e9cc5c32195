"""Two-worker efficiency of ``mlp`` against the floors this machine sets (issue 40, item 1).

``mlp`` at batch 64 per worker is communication-bound: 7.4 MB of gradients for a step of a few
milliseconds on one core. Each round runs, in alternating order:

- ``alone``: one process of ``tfscale.train`` on one core, the baseline;
- ``twin``: two such processes at once, one per core, exchanging nothing: what running two
  workers side by side costs before any exchange (shared memory bandwidth, caches, clock);
- each strategy on 2 workers (``--num_processes=2 --cpu_binding``: a core each).

Efficiency = the 2-worker rate / (2 x ``alone``). Two floors bound it from above:

- the twin floor, the twins' rate / (2 x ``alone``): no exchange can do better;
- the copy floor: the twin floor x step / (step + the shared-memory exchange's least time),
  that time being the bytes it must move at this machine's copy rate (every worker copies its
  gradients into its slot and sums its half of both slots: 2 x the gradient bytes through
  memory, measured as ``bench.common.memcpy_gbps`` measures a copy).

The fraction of the copy floor a strategy reaches is what the exchange still costs above its
least. Figures are medians over ``--rounds``.

    python -m bench.exchange_efficiency [--rounds 3 --steps 300 --strategies horovod,multiworker]
"""

from __future__ import annotations

import argparse
import os
import statistics
import threading
from typing import Any

from bench.common import cpu_description, in_round_order, memcpy_gbps, save, table, train

TARGET = 0.85
MLP = ["--model=mlp", "--image_size=32", "--batch_size=64", "--learning_rate=0.01"]
GRADIENT_MB = 7.4  # mlp's gradients at 32 px and 1000 classes (bench.step_breakdown)


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


def measure(strategies: list[str], rounds: int, steps: int) -> dict[str, Any]:
    cores = sorted(os.sched_getaffinity(0))[:2]
    base = [*MLP, f"--steps={steps}", f"--log_every={steps}"]
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
                runs[case].append(float(train([*base, f"--strategy={case}",
                                               "--num_processes=2", "--cpu_binding"])
                                        ["images_per_sec"]))
    copy_gbps = memcpy_gbps()
    alone = statistics.median(runs["alone"])
    twin_floor = statistics.median(runs["twin"]) / (2 * alone)
    step_ms = 64 * 1000.0 / alone
    least_ms = 2 * GRADIENT_MB * 1e6 / (copy_gbps * 1e9) * 1000.0
    copy_floor = twin_floor * step_ms / (step_ms + least_ms)
    rows = []
    for case in strategies:
        effs = [two / (2 * one) for two, one in zip(runs[case], runs["alone"], strict=True)]
        eff = statistics.median(runs[case]) / (2 * alone)
        rows.append({"strategy": case, "2 workers images/s": statistics.median(runs[case]),
                     "efficiency": eff, "range": f"{min(effs):.3f}-{max(effs):.3f}",
                     "of the copy floor": eff / copy_floor, "met": eff >= TARGET})
    return {"cpu": cpu_description(), "rounds": rounds, "steps": steps, "runs": runs,
            "alone_images_per_sec": alone, "step_ms": step_ms, "copy_gbps": copy_gbps,
            "least_exchange_ms": least_ms, "twin_floor": twin_floor, "copy_floor": copy_floor,
            "rows": rows, "target": TARGET}


def report(result: dict[str, Any]) -> str:
    return "\n".join([
        f"CPU: {result['cpu']}; {result['rounds']} rounds of {result['steps']} steps",
        f"one process alone: {result['alone_images_per_sec']:.0f} images/s "
        f"({result['step_ms']:.2f} ms a step)",
        f"twin floor (two processes side by side, no exchange): {result['twin_floor']:.3f}",
        f"copy floor: copy rate {result['copy_gbps']:.1f} GB/s, least exchange "
        f"{result['least_exchange_ms']:.2f} ms -> {result['copy_floor']:.3f}",
        "",
        table(result["rows"], ["strategy", "2 workers images/s", "efficiency", "range",
                               "of the copy floor", "met"]),
        "",
        f"Target: efficiency >= {result['target']} (median of the rounds; each round's "
        "efficiency against that round's one-process run in the range).",
    ])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategies", default="horovod,multiworker")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    result = measure(args.strategies.split(","), args.rounds, args.steps)
    save("exchange_efficiency", result)
    print(report(result))


if __name__ == "__main__":
    main()
