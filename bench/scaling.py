"""Weak-scaling efficiency on this machine: 2-worker throughput / (2 x 1-worker throughput),
every worker bound to its own core (the 1-worker run is pinned to one core too).

Models: ``mlp`` (~1.3M parameters per ~1.3 MFLOP: communication-bound) and ResNet-50.
Strategies: horovod, multiworker and ddl (when registered). Target >= 0.90 on ResNet-50.

    python -m bench.scaling [--resnet_strategies horovod]
"""

from __future__ import annotations

import argparse
import os
from typing import Any

from bench.common import save, table, train

TARGET = 0.90
CASES = {
    "mlp": ["--model=mlp", "--image_size=32", "--batch_size=64", "--steps=200",
            "--log_every=200"],
    "resnet50": ["--model=resnet50", "--image_size=224", "--batch_size=16", "--steps=5",
                 "--log_every=5"],
}


def measure(strategies: list[str], resnet_strategies: list[str]) -> dict[str, Any]:
    from tfscale.strategies import STRATEGIES

    core = sorted(os.sched_getaffinity(0))[:1]
    rows = []
    for model, flags in CASES.items():
        for strategy in strategies if model == "mlp" else resnet_strategies:
            if strategy not in STRATEGIES:
                continue
            base = [*flags, f"--strategy={strategy}", "--learning_rate=0.01"]
            one = train([*base, "--num_processes=1"], cores=core)
            two = train([*base, "--num_processes=2", "--cpu_binding"])
            rows.append({
                "model": model, "strategy": strategy,
                "1 worker images/s": one["images_per_sec"],
                "2 workers images/s": two["images_per_sec"],
                "efficiency": two["images_per_sec"] / (2 * one["images_per_sec"]),
            })
    resnet = [r["efficiency"] for r in rows if r["model"] == "resnet50"]
    return {"rows": rows, "target": TARGET,
            "met": bool(resnet) and min(resnet) >= TARGET}


def report(result: dict[str, Any]) -> str:
    return "\n".join([
        table(result["rows"], ["model", "strategy", "1 worker images/s", "2 workers images/s",
                               "efficiency"]),
        "", f"ResNet-50 target >= {TARGET}: {'met' if result['met'] else 'NOT met'}",
    ])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategies", default="horovod,multiworker,ddl")
    parser.add_argument("--resnet_strategies", default="horovod")
    args = parser.parse_args()
    result = measure(args.strategies.split(","), args.resnet_strategies.split(","))
    save("scaling", result)
    print(report(result))


if __name__ == "__main__":
    main()
