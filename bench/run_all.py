"""Runs every benchmark and writes ``bench/RESULTS.md`` (tables plus target verdicts).

    python -m bench.run_all            # about 95 minutes on 2 cores; run on an idle machine
    python -m bench.run_all --reuse    # keep sections whose bench/results/<name>.json exists
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
from pathlib import Path

from bench import (
    allreduce,
    compute,
    defaults,
    gradient_lag,
    horovod_cycle,
    overhead,
    recompute,
    scaling,
    step_breakdown,
)
from bench.common import OUT

RESULTS = Path(__file__).resolve().parent / "RESULTS.md"


SECTIONS = (
    ("Overhead: tfscale.train vs a plain Keras script", overhead,
     lambda: overhead.measure(rounds=4, steps=6, batch=32, image_size=224)),
    ("Compute: XLA x precision x threads", compute, lambda: compute.measure(4, 16, 224)),
    ("All-reduce: grouped vs per tensor", allreduce, allreduce.measure),
    ("Weak scaling: 2 workers vs 1", scaling,
     lambda: scaling.measure(["horovod", "multiworker", "ddl"],
                             ["horovod", "multiworker", "ddl"], rounds=2)),
    ("Step breakdown: where a step's milliseconds go", step_breakdown,
     lambda: step_breakdown.measure(3, 200, step_breakdown.DEFAULT_RUNS.split(","))),
    ("Horovod's cost while it carries nothing, per cycle time", horovod_cycle,
     lambda: horovod_cycle.measure(3, 8.0)),
    ("Defaults: the README command against hand-set flags", defaults,
     lambda: defaults.measure(2, 8)),
    ("Gradient lag (`--gradient_lag=1`)", gradient_lag,
     lambda: gradient_lag.measure(3, 300, list(gradient_lag.RUNS))),
    ("Activation recomputation (`--recompute`)", recompute,
     lambda: recompute.measure(2, 4, True)),
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reuse", action="store_true",
                        help="reuse saved results instead of measuring those sections again")
    parser.add_argument("--only", default="",
                        help="comma-separated section names (e.g. step_breakdown,defaults): "
                             "produce only these and replace them in the existing RESULTS.md, "
                             "keeping its other sections as they are")
    args = parser.parse_args()
    only = {name for name in args.only.split(",") if name}
    names = {module.__name__.split(".")[-1] for _, module, _ in SECTIONS}
    if only - names:
        parser.error(f"--only: unknown {sorted(only - names)}; choose from {sorted(names)}")
    kept = _sections(RESULTS.read_text()) if only and RESULTS.exists() else {}
    sections = []
    # Each measurement runs when its turn comes, so every finished section is printed and saved
    # even if a later one fails.
    for title, module, measure in SECTIONS:
        name = module.__name__.split(".")[-1]
        if only and name not in only:
            if title in kept:
                sections.append(kept[title])
            continue
        saved = OUT / f"{name}.json"
        if args.reuse and saved.exists():
            result = json.loads(saved.read_text())
        else:
            result = measure()
            module.save(name, result)  # type: ignore[attr-defined]
        measured = f" (measured {datetime.date.today()})" if only else ""
        sections.append(f"## {title}\n\n`python -m bench.{name}`{measured}\n\n"
                        f"{module.report(result)}\n")
        print(sections[-1], flush=True)
    header = (f"# Benchmark results\n\nMeasured {datetime.date.today()} on {platform.node()}: "
              f"{os.cpu_count()} cores, {platform.processor() or platform.machine()}, "
              "TensorFlow CPU build. Produced by `python -m bench.run_all`; JSON in "
              "`bench/results/`.\n")
    if only and RESULTS.exists():
        header = _keep_header(RESULTS.read_text(), header)
    RESULTS.write_text(header + "\n" + "\n".join(sections))


def _sections(text: str) -> dict[str, str]:
    """The ``## title`` sections of a RESULTS.md, by title, each with its heading."""
    parts = text.split("\n## ")[1:]
    return {part.split("\n", 1)[0]: "## " + part.rstrip("\n") + "\n" for part in parts}


def _keep_header(text: str, header: str) -> str:
    """The existing header, with a line saying which sections were measured later."""
    old = text.split("\n## ", 1)[0].rstrip("\n")
    note = ("Sections marked \"(measured DATE)\" were measured again then, by "
            "`python -m bench.run_all --only NAMES`.")
    return old + ("" if note in old else "\n\n" + note) + "\n"


if __name__ == "__main__":
    main()
