"""Runs every benchmark and writes ``bench/RESULTS.md`` (tables plus target verdicts).

    python -m bench.run_all            # about 45 minutes on 2 cores; run on an idle machine
    python -m bench.run_all --reuse    # keep sections whose bench/results/<name>.json exists
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
from pathlib import Path

from bench import allreduce, compute, overhead, scaling
from bench.common import OUT

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reuse", action="store_true",
                        help="reuse saved results instead of measuring those sections again")
    reuse = parser.parse_args().reuse
    sections = []
    # Each measurement runs when its turn comes, so every finished section is printed and saved
    # even if a later one fails.
    for title, module, measure in (
        ("Overhead: tfscale.train vs a plain Keras script", overhead,
         lambda: overhead.measure(rounds=2, steps=6, batch=32, image_size=224)),
        ("Compute: XLA x precision x threads", compute, lambda: compute.measure(4, 16, 224)),
        ("All-reduce: grouped vs per tensor", allreduce, allreduce.measure),
        ("Weak scaling: 2 workers vs 1", scaling,
         lambda: scaling.measure(["horovod", "multiworker", "ddl"],
                                 ["horovod", "multiworker", "ddl"])),
    ):
        name = module.__name__.split(".")[-1]
        saved = OUT / f"{name}.json"
        if reuse and saved.exists():
            result = json.loads(saved.read_text())
        else:
            result = measure()
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
