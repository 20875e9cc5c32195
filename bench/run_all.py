"""Runs every benchmark and writes ``bench/RESULTS.md`` (tables plus target verdicts).

    python -m bench.run_all            # about 30-40 minutes on 2 cores; run on an idle machine
"""

from __future__ import annotations

import datetime
import os
import platform
from pathlib import Path

from bench import allreduce, compute, overhead, scaling

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def main() -> None:
    sections = []
    for title, module, result in (
        ("Overhead: tfscale.train vs a plain Keras script", overhead,
         overhead.measure(rounds=2, steps=6, batch=32, image_size=224)),
        ("Compute: XLA x precision x threads", compute, compute.measure(5, 32, 224)),
        ("All-reduce: grouped vs per tensor", allreduce, allreduce.measure()),
        ("Weak scaling: 2 workers vs 1", scaling,
         scaling.measure(["horovod", "multiworker", "ddl"], ["horovod"])),
    ):
        name = module.__name__.split(".")[-1]
        module.save(name, result)  # type: ignore[attr-defined]
        sections.append(f"## {title}\n\n`python -m bench.{name}`\n\n{module.report(result)}\n")
        print(sections[-1], flush=True)
    header = (f"# Benchmark results\n\nMeasured {datetime.date.today()} on {platform.node()}: "
              f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
              "TensorFlow CPU build. Produced by `python -m bench.run_all`; JSON in "
              "`bench/results/`.\n")
    RESULTS.write_text(header + "\n" + "\n".join(sections))


if __name__ == "__main__":
    main()
