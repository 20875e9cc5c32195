"""The shared-memory all-reduce of today's code against another revision's, in alternating rounds.

``bench.exchange_efficiency``'s bare exchange (mlp's 9.4 MB of gradients, a sum between two
processes on a core each, or a mean with ``--divisor 2``, 200 timed calls) run with
``tfscale/exchange/shared_memory.py`` as it is in the working tree and as it is at
``--against`` (``git show REV:...``), each with no work between calls (back to back) and with
``--gap_ms`` of work between them (as in training, where memory left idle for a step is
slower to reach). Prints the median of each over the rounds and the ratio against / today
(above 1: today's is faster).

    python -m bench.shared_memory_ab --against HEAD~1 [--rounds 6 --gap_ms 10]
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from bench.common import ROOT, cpu_description, in_round_order, save, table
from bench.exchange_efficiency import bare_exchange_ms

MODULE = "tfscale/exchange/shared_memory.py"


def measure(against: str, rounds: int, gap_ms: float, divisor: int = 1) -> dict[str, Any]:
    """Medians of the bare exchange per (version, gap) over ``rounds`` alternating rounds."""
    old = subprocess.run(["git", "show", f"{against}:{MODULE}"], cwd=ROOT, check=True,
                         capture_output=True, text=True).stdout
    times: dict[tuple[str, float], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="tfscale-ab-") as tmp:
        path = Path(tmp) / "shared_memory_against.py"
        path.write_text(old)
        versions = {"today": None, against: str(path)}
        for round_ in range(rounds):
            for name in in_round_order(list(versions), round_):
                for gap in (0.0, gap_ms):
                    ms = bare_exchange_ms([0, 1], gap, module=versions[name],
                                          divisor=divisor)
                    times.setdefault((name, gap), []).append(ms)
                    print(f"[round {round_}] {name}, {gap:g} ms between calls: {ms:.3f} ms",
                          flush=True)
    rows = []
    for gap in (0.0, gap_ms):
        today, other = times[("today", gap)], times[(against, gap)]
        rows.append({"ms of work between calls": gap,
                     "today ms (median)": statistics.median(today),
                     "today range": f"{min(today):.3f}-{max(today):.3f}",
                     f"{against} ms (median)": statistics.median(other),
                     f"{against} range": f"{min(other):.3f}-{max(other):.3f}",
                     f"{against} / today": statistics.median(other) / statistics.median(today)})
    return {"cpu": cpu_description(), "against": against, "rounds": rounds, "divisor": divisor,
            "rows": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--against", default="HEAD", help="git revision to compare with")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--gap_ms", type=float, default=10.0)
    parser.add_argument("--divisor", type=int, default=1,
                        help="1: the sum both strategies run; 2: a mean in the exchange")
    args = parser.parse_args()
    result = measure(args.against, args.rounds, args.gap_ms, args.divisor)
    save("shared_memory_ab", result)
    print(f"CPU: {result['cpu']}; {args.rounds} rounds")
    print(table(result["rows"], list(result["rows"][0])))


if __name__ == "__main__":
    main()
