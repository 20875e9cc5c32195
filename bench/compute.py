"""ResNet-50 training throughput for XLA x precision and thread settings, as a fraction of the
machine's FLOP ceiling, against the plain Keras script's default.

Ceiling = measured float32 matmul GFLOP/s / ~24.5 GFLOP per 224x224 training image. Target: the
best tfscale setting >= 1.15 x the plain Keras default.

    python -m bench.compute [--steps 5 --batch_size 32]
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from bench.common import RESNET50_TRAIN_GFLOP, matmul_gflops, run_script, save, table, train

TARGET = 1.15
COMBOS = [(x, p) for p in ("fp32", "mixed_bfloat16") for x in ("off", "jit", "auto")]
THREADS = [(2, 1), (1, 1)]


def measure(steps: int, batch: int, image_size: int) -> dict[str, Any]:
    gflops = matmul_gflops()
    per_image = RESNET50_TRAIN_GFLOP * (image_size / 224) ** 2
    ceiling = gflops / per_image
    base = ["--model=resnet50", f"--batch_size={batch}", f"--steps={steps}",
            f"--image_size={image_size}", "--learning_rate=0.01", f"--log_every={steps}"]
    plain = run_script([sys.executable, "-m", "bench.plain_keras", f"--batch_size={batch}",
                        f"--steps={steps}", f"--image_size={image_size}"])
    rows: list[dict[str, Any]] = [{"setting": "plain keras (default)", **plain}]
    for xla, precision in COMBOS:
        r = train([*base, f"--xla={xla}", f"--precision={precision}"])
        rows.append({"setting": f"tfscale xla={xla} precision={precision}", "xla": xla,
                     "precision": precision, "images_per_sec": r["images_per_sec"],
                     "step_time_ms": r["step_time_ms"]})
    best = max(rows[1:], key=lambda r: r["images_per_sec"])
    for intra, inter in THREADS:
        r = train([*base, f"--xla={best['xla']}", f"--precision={best['precision']}",
                   f"--intra_op_threads={intra}", f"--inter_op_threads={inter}"])
        rows.append({"setting": f"{best['setting']} intra={intra} inter={inter}",
                     "images_per_sec": r["images_per_sec"], "step_time_ms": r["step_time_ms"]})
    for row in rows:
        row["fraction_of_ceiling"] = row["images_per_sec"] / ceiling
    top = max(rows[1:], key=lambda r: r["images_per_sec"])
    speedup = top["images_per_sec"] / plain["images_per_sec"]
    return {"rows": rows, "matmul_gflops": gflops, "ceiling_images_per_sec": ceiling,
            "best_setting": top["setting"], "speedup_vs_plain": speedup, "target": TARGET,
            "met": speedup >= TARGET,
            "setup": {"batch_size": batch, "image_size": image_size, "timed_steps": steps - 1}}


def report(result: dict[str, Any]) -> str:
    return "\n".join([
        f"float32 matmul: {result['matmul_gflops']:.1f} GFLOP/s -> ceiling "
        f"{result['ceiling_images_per_sec']:.2f} images/s",
        "",
        table(result["rows"], ["setting", "images_per_sec", "step_time_ms",
                               "fraction_of_ceiling"]),
        "",
        f"best: {result['best_setting']} = {result['speedup_vs_plain']:.3f} x plain keras "
        f"(target >= {TARGET}: {'met' if result['met'] else 'NOT met'})",
    ])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--image_size", type=int, default=224)
    args = parser.parse_args()
    result = measure(args.steps, args.batch_size, args.image_size)
    save("compute", result)
    print(report(result))


if __name__ == "__main__":
    main()
