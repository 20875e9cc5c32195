"""The README's main command with tfscale's defaults against the same command hand-tuned.

The command (`make demo`: ResNet-50, ``--strategy=horovod --num_processes=2``, batch 8 per
worker) runs as the README gives it and with each set of hand-set flags below, alternating
within each round, in forward order in odd rounds and backward in even ones (so drift during
a round favours no run). Its defaults bind each worker to its own core (``--cpu_binding``),
exchange the gradients and host values through shared memory (``--node_exchange=auto``) and so
set Horovod's cycle time to 50 ms (5 ms where Horovod carries collectives). Target: the plain
command within 5% of the best hand-set one. The command also runs a second time in each round,
unchanged: how far those identical runs land from the first says how much of a variant's lead
is noise (single runs of the same work vary by 10-20% on the project's test machines).

    python -m bench.defaults [--rounds 2 --steps 8]

About 14 minutes on 2 cores with 2 rounds.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from bench.common import cpu_description, in_round_order, save, table, train

TARGET = 0.95
COMMAND = ["--model=resnet50", "--strategy=horovod", "--num_processes=2", "--batch_size=8",
           "--learning_rate=0.003", "--lr_scaling=linear"]
DEFAULTS = "README command (defaults)"
AGAIN = "README command again (identical)"
VARIANTS: dict[str, list[str]] = {
    DEFAULTS: [],
    "old defaults: --nocpu_binding --cycle_time_ms=1": ["--nocpu_binding", "--cycle_time_ms=1"],
    "--cycle_time_ms=1 (Horovod's default)": ["--cycle_time_ms=1"],
    "--cycle_time_ms=5 (the default before)": ["--cycle_time_ms=5"],
    "--cycle_time_ms=20": ["--cycle_time_ms=20"],
    "--node_exchange=collectives (gradients over Gloo)": ["--node_exchange=collectives"],
    "--intra_op_threads=1 --inter_op_threads=1":
        ["--intra_op_threads=1", "--inter_op_threads=1"],
    AGAIN: [],  # last, so a round's two identical runs lie furthest apart in time
}


def measure(rounds: int, steps: int) -> dict[str, Any]:
    rows = []
    for round_ in range(1, rounds + 1):
        for name in in_round_order(list(VARIANTS), round_ - 1):
            extra = VARIANTS[name]
            out = train([*COMMAND, f"--steps={steps}", f"--log_every={steps}", *extra])
            rows.append({"round": round_, "run": name, "images_per_sec": out["images_per_sec"],
                         "step_time_ms": out["step_time_ms"]})
    means = {name: statistics.mean(r["images_per_sec"] for r in rows if r["run"] == name)
             for name in VARIANTS}
    default = means[DEFAULTS]
    best_name = max((n for n in VARIANTS if n not in (DEFAULTS, AGAIN)), key=lambda n: means[n])
    summary = [{"run": name, "images_per_sec": rate, "vs defaults": rate / default}
               for name, rate in means.items()]
    ratio = default / means[best_name]
    return {"cpu": cpu_description(), "rows": rows, "summary": summary, "best": best_name,
            "ratio": ratio, "identical_ratio": means[AGAIN] / default, "target": TARGET,
            "met": ratio >= TARGET,
            "setup": {"command": " ".join(COMMAND), "steps": steps, "rounds": rounds}}


def report(result: dict[str, Any]) -> str:
    verdict = "met" if result["met"] else "NOT met"
    return "\n".join([
        f"CPU: {result['cpu']}", "",
        f"`python -m tfscale.train {result['setup']['command']}` plus the flags in the first "
        "column, rounds alternating.", "",
        table(result["rows"], ["round", "run", "images_per_sec", "step_time_ms"]), "",
        table(result["summary"], ["run", "images_per_sec", "vs defaults"]), "",
        f"defaults / best hand-set ({result['best']}) = {result['ratio']:.3f} "
        f"(target >= {TARGET}: {verdict}); the identical second run / the first = "
        f"{result['identical_ratio']:.3f}",
    ])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=8)
    args = parser.parse_args()
    result = measure(args.rounds, args.steps)
    save("defaults", result)
    print(report(result))


if __name__ == "__main__":
    main()
