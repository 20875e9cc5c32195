"""Horovod's all-reduce inside a training step, against the call and the step timed apart.

bench.shaped_links charges a flat Horovod run across nodes its one-node step plus the grouped
call timed back to back. Where the link binds (mlp, 2x2 flat, 1 Gbit/s) the runs took 5-29%
longer than that over the sets of 2026-12-05 on a Xeon, and Horovod's timeline put the excess
in MPI_Allreduce itself. This bench asks whether tfscale.train adds it: on the two-node
mini-cluster, two ranks per node on each node's one core as in the 2x2 flat layout, at one link
speed, :mod:`bench.call_in_step_worker` times the call alone, a plain Keras step of mlp alone,
the step with the call inside it (no Keras fit, no tfscale), and a control: a chain of matrix
products as long as the step, alone and followed by the call. The excess of a pair is its time
less the sum of its parts' times. Beside each mode's time, how the node's core spent it (user,
system, softirq, idle; the node's ranks share it).

    python -m bench.call_in_step [--link 1 --ranks_per_node 2 --rounds 3 --iterations 40
                                  --transport mpi]

As root. ``--ranks_per_node 1`` runs one rank on each node's core instead (the 2x1 layout).
``--transport gloo`` starts the ranks with ``horovodrun --gloo`` instead of ``srun``: Horovod's
call over Gloo, whose waits block where Open MPI's poll.

About 4 minutes at 1 Gbit/s. Needs the mini-cluster (``TFSCALE_WITH_MPI=1 make setup``).
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

from bench.common import cpu_description, save, table
from bench.shaped_links import on_both_nodes, shape, two_nodes

CYCLE_MS = 5  # what tfscale.train sets for Horovod across nodes on CPUs


def measure(gbit: float, local: int, rounds: int, iterations: int,
            transport: str = "mpi") -> dict[str, Any]:
    """One worker run at ``gbit`` Gbit/s, ``local`` ranks on each node, Horovod over
    ``transport``: its JSON line (ms per iteration of each mode, and its core's split)."""
    with two_nodes():
        shape(gbit)
        return on_both_nodes("bench.call_in_step_worker", f"--iterations={iterations}",
                             f"--rounds={rounds}", local=local, cycle_ms=CYCLE_MS, timeout=1800,
                             transport=transport)


def excesses(ms: dict[str, list[float]]) -> dict[str, float]:
    """Each pair's median time less the sum of its parts' medians, in ms."""
    median = {mode: statistics.median(values) for mode, values in ms.items()}
    return {pair: median[pair] - sum(median[part] for part in pair.split("+"))
            for pair in ("step+call", "chain+call")}


def core_rows(core_ms: dict[str, list[dict[str, float]]]) -> list[dict[str, Any]]:
    """Per mode, the median over the rounds of each way the core spent an iteration (ms), and
    the share of the iteration it was busy."""
    rows = []
    for mode, rounds in core_ms.items():
        row: dict[str, Any] = {"mode": mode}
        for field in rounds[0]:
            row[field] = statistics.median(r[field] for r in rounds)
        spent = sum(v for k, v in row.items() if k != "mode")
        row["busy"] = f"{1 - row['idle'] / spent:.0%}" if spent else "-"
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--link", type=float, default=1.0, help="Gbit/s of each node's link")
    parser.add_argument("--ranks_per_node", type=int, choices=(1, 2), default=2,
                        help="ranks on each node's one core (2: the 2x2 flat layout)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--iterations", type=int, default=40)
    parser.add_argument("--transport", choices=("mpi", "gloo"), default="mpi",
                        help="Horovod over Open MPI (srun) or Gloo (horovodrun --gloo)")
    args = parser.parse_args()
    if not args.link > 0:
        parser.error(f"--link={args.link:g}: expected a link speed in Gbit/s above 0")
    started = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    result = measure(args.link, args.ranks_per_node, args.rounds, args.iterations,
                     args.transport)
    ms = result["ms"]
    rows = [{"mode": mode, "median ms": statistics.median(values),
             "rounds": ", ".join(f"{v:.1f}" for v in values)} for mode, values in ms.items()]
    extra = excesses(ms)
    print(table(rows, ["mode", "median ms", "rounds"]))
    for pair, value in extra.items():
        print(f"{pair}: {value:+.1f} ms over its parts")
    print("\nHow the node's core spent an iteration (ms, median of the rounds):")
    print(table(core_rows(result["core_ms"]),
                ["mode", "user", "system", "softirq", "idle", "busy"]))
    path = save("call_in_step", {"cpu": cpu_description(), "started": started,
                                 "link_gbit": args.link, "ranks_per_node": args.ranks_per_node,
                                 "transport": args.transport,
                                 "cycle_ms": CYCLE_MS,
                                 **result, "excess_ms": extra})
    print(f"saved {path}")


if __name__ == "__main__":
    main()
