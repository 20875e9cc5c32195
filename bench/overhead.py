"""Overhead of tfscale.train against a plain Keras script (same model, batch, optimizer, data,
precision and threads: fp32, TensorFlow's default thread pools in both).

Each round runs both, in alternating order (plain first in even rounds, tfscale.train first in
odd ones), so drift in the machine's speed favours neither. The ratio is per round (tfscale /
plain of that round); the result is the median over the rounds. Target (issue 40): >= 1.00.

    python -m bench.overhead [--rounds 4 --steps 6 --batch_size 32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from bench.common import cpu_description, in_round_order, run_script, save, table, train

TARGET = 1.00
RUNS = ("plain keras", "tfscale.train")


def one(run: str, steps: int, batch: int, image_size: int) -> dict[str, Any]:
    if run == "plain keras":
        return dict(run_script([sys.executable, "-m", "bench.plain_keras",
                                f"--batch_size={batch}", f"--steps={steps}",
                                f"--image_size={image_size}"]))
    ours = train(["--model=resnet50", f"--batch_size={batch}", f"--steps={steps}",
                  f"--image_size={image_size}", "--learning_rate=0.01", "--precision=fp32",
                  f"--log_every={steps}"])
    return {"steps": ours["steps"], "images_per_sec": ours["images_per_sec"],
            "step_time_ms": ours["step_time_ms"]}


def measure(rounds: int, steps: int, batch: int, image_size: int) -> dict[str, Any]:
    rows = []
    ratios = []
    for round_ in range(rounds):
        rates = {}
        for run in in_round_order(RUNS, round_):
            result = one(run, steps, batch, image_size)
            rates[run] = float(result["images_per_sec"])
            rows.append({"round": round_ + 1, "run": run, **result})
        ratios.append(rates["tfscale.train"] / rates["plain keras"])
    ratio = statistics.median(ratios)
    return {"cpu": cpu_description(), "rows": rows, "ratios": ratios,
            "plain_images_per_sec": statistics.median(
                r["images_per_sec"] for r in rows if r["run"] == "plain keras"),
            "tfscale_images_per_sec": statistics.median(
                r["images_per_sec"] for r in rows if r["run"] == "tfscale.train"),
            "ratio": ratio, "target": TARGET, "met": ratio >= TARGET,
            "setup": {"model": "resnet50", "batch_size": batch, "image_size": image_size,
                      "timed_steps_per_run": steps - 1, "rounds": rounds}}


def report(result: dict[str, Any]) -> str:
    return "\n".join([
        table(result["rows"], ["round", "run", "images_per_sec", "step_time_ms"]),
        "",
        f"CPU: {result.get('cpu', '?')}",
        "tfscale / plain per round: " + ", ".join(f"{r:.3f}" for r in result.get("ratios", [])),
        f"tfscale / plain = {result['ratio']:.3f}, median of the rounds (target >= {TARGET}: "
        f"{'met' if result['met'] else 'NOT met'})",
    ])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--image_size", type=int, default=224)
    args = parser.parse_args()
    result = measure(args.rounds, args.steps, args.batch_size, args.image_size)
    save("overhead", result)
    print(report(result))


if __name__ == "__main__":
    main()
