"""The hierarchical exchange's node phases as TensorFlow ops against ``tf.numpy_function``, on
the two-node mini-cluster.

A job of several nodes sums its gradients in three phases: a reduce-scatter inside each node
(shared memory), the sum of each chunk across the nodes, and an all-gather inside each node.
Since bbb1f90 the first and last run as ``tfscale.exchange.native``'s ops; with
``TFSCALE_NATIVE_EXCHANGE=0`` they run in ``tf.numpy_function``, as before. This runs
``bench.shaped_links``'s 2x2 hierarchical layouts (2 nodes, each one core of this VM with its
2 ranks, the link shaped by ``tc``) both ways, in alternating rounds, and gives each round's
ratio (ops / numpy_function images/s) and their median.

    python -m bench.node_phase_ops [--rounds 4 --gbit 10 --model mlp]   (as root)
    python -m bench.node_phase_ops --report     (the table of the last run)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from typing import Any

from bench.common import OUT, cpu_description, in_round_order, save, table
from bench.shaped_links import ACROSS, shape, train, two_nodes
from tfscale.cli.output import ends_quietly
from tfscale.exchange.native import SWITCH

LAYOUTS = ("2x2 hierarchical", "2x2 multiworker hierarchical")
ARMS = {"ops": "1", "numpy_function": "0"}


def measure(model: str, gbit: float, rounds: int) -> list[dict[str, Any]]:
    """Every layout under both arms once per round, the order reversed in odd rounds."""
    layouts = [layout for layout in ACROSS if layout.name in LAYOUTS]
    cases = [(layout, arm) for layout in layouts for arm in ARMS]
    runs = []
    shape(gbit)  # two_nodes() unshapes it
    try:
        for round_ in range(rounds):
            for layout, arm in in_round_order(cases, round_):
                os.environ[SWITCH] = ARMS[arm]  # srun passes the environment to the ranks
                result = train(model, layout)
                runs.append({"round": round_, "layout": layout.name, "arm": arm,
                             "images_per_sec": result["images_per_sec"]})
                print(f"[round {round_}] {layout.name}, {arm}: "
                      f"{result['images_per_sec']:.0f} images/s", flush=True)
    finally:
        os.environ.pop(SWITCH, None)
    return runs


def rows(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per layout: median images/s of each arm and the per-round ratios' median and range."""
    out = []
    for name in LAYOUTS:
        by_round: dict[int, dict[str, float]] = {}
        for run in runs:
            if run["layout"] == name:
                by_round.setdefault(run["round"], {})[run["arm"]] = run["images_per_sec"]
        pairs = [r for r in by_round.values() if set(r) == set(ARMS)]
        if not pairs:
            continue
        ratios = [r["ops"] / r["numpy_function"] for r in pairs]
        out.append({"layout": name,
                    "ops images/s": statistics.median(r["ops"] for r in pairs),
                    "numpy_function images/s": statistics.median(
                        r["numpy_function"] for r in pairs),
                    "ratio (median)": statistics.median(ratios),
                    "ratios": ", ".join(f"{x:.3f}" for x in ratios),
                    "faster rounds": f"{sum(x > 1 for x in ratios)} of {len(ratios)}"})
    return out


def report(saved: dict[str, Any]) -> str:
    """The saved run's heading and table."""
    return (f"{saved['model']}, 2 nodes x 2 ranks, {saved['gbit']:g} Gbit/s, {saved['rounds']} "
            f"rounds, {saved['when']} ({saved['cpu']}):\n"
            + table(rows(saved["runs"]), ["layout", "ops images/s", "numpy_function images/s",
                                          "ratio (median)", "ratios", "faster rounds"]))


@ends_quietly
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--gbit", type=float, default=10.0, help="the link's rate (0: unshaped)")
    parser.add_argument("--model", default="mlp", choices=("mlp", "resnet50"))
    parser.add_argument("--report", action="store_true", help="only the table of the last run")
    args = parser.parse_args()
    if args.report:
        print(report(json.loads((OUT / "node_phase_ops.json").read_text())))
        return 0
    start = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    with two_nodes():
        runs = measure(args.model, args.gbit, args.rounds)
    saved = {"cpu": cpu_description(), "when": start, "model": args.model, "gbit": args.gbit,
             "rounds": args.rounds, "runs": runs, "rows": rows(runs)}
    save("node_phase_ops", saved)
    print(report(saved))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
