"""Overhead of tfscale.train against a plain Keras script (same model, batch, optimizer, data).

Alternates the two in the same run so drift in the machine's speed hits both alike. Target:
tfscale / plain >= 0.97.

    python -m bench.overhead [--rounds 2 --steps 6 --batch_size 32]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from typing import Any

from bench.common import run_script, save, table, train

TARGET = 0.97


def measure(rounds: int, steps: int, batch: int, image_size: int) -> dict[str, Any]:
    rows = []
    for round_ in range(1, rounds + 1):
        plain = run_script([sys.executable, "-m", "bench.plain_keras", f"--batch_size={batch}",
                            f"--steps={steps}", f"--image_size={image_size}"])
        rows.append({"round": round_, "run": "plain keras", **plain})
        ours = train(["--model=resnet50", f"--batch_size={batch}", f"--steps={steps}",
                      f"--image_size={image_size}", "--learning_rate=0.01",
                      f"--log_every={steps}"])
        rows.append({"round": round_, "run": "tfscale.train", "steps": ours["steps"],
                     "images_per_sec": ours["images_per_sec"],
                     "step_time_ms": ours["step_time_ms"]})
    plain_rate = statistics.mean(r["images_per_sec"] for r in rows if r["run"] == "plain keras")
    ours_rate = statistics.mean(r["images_per_sec"] for r in rows if r["run"] != "plain keras")
    return {"rows": rows, "plain_images_per_sec": plain_rate, "tfscale_images_per_sec": ours_rate,
            "ratio": ours_rate / plain_rate, "target": TARGET,
            "met": ours_rate / plain_rate >= TARGET,
            "setup": {"model": "resnet50", "batch_size": batch, "image_size": image_size,
                      "timed_steps_per_run": steps - 1, "rounds": rounds}}


def report(result: dict[str, Any]) -> str:
    return "\n".join([
        table(result["rows"], ["round", "run", "images_per_sec", "step_time_ms"]),
        "",
        f"tfscale / plain = {result['ratio']:.3f} (target >= {TARGET}: "
        f"{'met' if result['met'] else 'NOT met'})",
    ])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--image_size", type=int, default=224)
    args = parser.parse_args()
    result = measure(args.rounds, args.steps, args.batch_size, args.image_size)
    save("overhead", result)
    print(report(result))


if __name__ == "__main__":
    main()
