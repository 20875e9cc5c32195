"""One multi-node run at two shaped link speeds, back to back: does the slower link slow the
training step, and is it the exchange that grows?

``bench.shaped_links`` runs every layout and model of a round between its runs at two link
speeds, so minutes of this VM's drift lie between them. Here one layout of one model runs at
each link in turn (the order alternating by round), nothing in between, on the two-node
mini-cluster (launch.minicluster, each node on one core). Each run reports its images/s after
the first progress interval and the exchange's share of the step on each progress line
(``exchange NN%``, :mod:`tfscale.exchange.timing`): a link that costs time grows the share;
drift of the whole machine moves the rate and leaves the share.

    python -m bench.shaped_link_pairs [--rounds 3 --links 10,25 --model mlp
                                       --layout "2x2 multiworker flat"]      (as root)
    python -m bench.shaped_link_pairs --report [--result FILE ...]   (several: rounds pooled)
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import (
    OUT,
    ROOT,
    add_report_flags,
    cpu_description,
    in_round_order,
    print_saved_report,
    save,
    table,
)
from tfscale.forecast.calibrate import progress_windows

SAME = ("cpu", "model", "layout", "links")  # what results pooled must share


def shares(stdout: str) -> list[float]:
    """The exchange's share of the step on each of a run's progress lines."""
    return [share for _, _, share in progress_windows(stdout) if share is not None]


def measure(rounds: int, links: list[float], model: str, layout_name: str) -> dict[str, Any]:
    from bench.shaped_links import ACROSS, _train_command, shape, steady_rate, two_nodes

    layouts = {layout.name: layout for layout in ACROSS}
    if layout_name not in layouts:
        raise ValueError(f"--layout={layout_name!r}; expected one of {', '.join(layouts)}")
    layout = layouts[layout_name]
    runs: list[dict[str, Any]] = []
    OUT.mkdir(parents=True, exist_ok=True)
    with two_nodes():
        for round_ in range(rounds):
            for gbit in in_round_order(links, round_):
                shape(gbit)
                with tempfile.TemporaryDirectory(dir=OUT) as tmp:
                    proc = subprocess.run(
                        _train_command(model, layout, ["-N2"], Path(tmp) / "run"), cwd=ROOT,
                        capture_output=True, text=True, timeout=900, check=False)
                if proc.returncode:
                    raise RuntimeError(f"{model} {layout.name} at {gbit:g} Gbit/s failed:\n"
                                       f"{proc.stdout[-2000:]}{proc.stderr[-2000:]}")
                runs.append({"round": round_, "gbit": gbit,
                             "steady_images_per_sec": steady_rate(proc.stdout),
                             "exchange_shares": shares(proc.stdout)})
                print(json.dumps(runs[-1]), flush=True)
        shape(0)
    return {"cpu": cpu_description(), "rounds": rounds, "model": model, "layout": layout.name,
            "links": links, "runs": runs}


def report(result: dict[str, Any]) -> str:
    """Each round's rates and exchange shares at both links, the slower link's rate over the
    faster's, and that ratio's median and mean over the rounds."""
    slow, fast = sorted(result["links"])
    rows, ratios = [], []
    for round_ in sorted({run["round"] for run in result["runs"]}):
        at = {run["gbit"]: run for run in result["runs"] if run["round"] == round_}
        if slow not in at or fast not in at:
            continue
        ratio = at[slow]["steady_images_per_sec"] / at[fast]["steady_images_per_sec"]
        ratios.append(ratio)
        row: dict[str, Any] = {"round": round_, f"{slow:g} / {fast:g} Gbit/s": ratio}
        for gbit in (slow, fast):
            row[f"images/s at {gbit:g}"] = at[gbit]["steady_images_per_sec"]
            row[f"exchange share at {gbit:g}"] = statistics.mean(at[gbit]["exchange_shares"])
        rows.append(row)
    columns = ["round", f"images/s at {slow:g}", f"images/s at {fast:g}",
               f"{slow:g} / {fast:g} Gbit/s", f"exchange share at {slow:g}",
               f"exchange share at {fast:g}"]
    summary = (f"\n{slow:g} Gbit/s against {fast:g}: median {statistics.median(ratios):.3f}, "
               f"mean {statistics.mean(ratios):.3f} over {len(ratios)} round(s)\n"
               if ratios else "\nno round ran at both links\n")
    return (f"CPU: {result['cpu']}; {result['model']}, {result['layout']}\n"
            + table(rows, columns) + summary)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--links", default="10,25", help="two speeds in Gbit/s")
    parser.add_argument("--model", default="mlp", choices=("mlp", "resnet50"))
    parser.add_argument("--layout", default="2x2 multiworker flat")
    add_report_flags(parser)
    args = parser.parse_args()
    if args.report:
        print_saved_report(parser, args.result, "shaped_link_pairs", report, SAME)
        return 0
    links = [float(x) for x in args.links.split(",") if x.strip()]
    if len(links) != 2 or links[0] == links[1] or min(links) <= 0:
        parser.error(f"--links={args.links!r}; expected two different speeds in Gbit/s, "
                     "e.g. 10,25")
    try:
        result = measure(args.rounds, links, args.model, args.layout)
    except ValueError as error:
        parser.error(str(error))
    save("shaped_link_pairs", result)
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
