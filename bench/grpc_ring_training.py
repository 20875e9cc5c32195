"""gRPC's flat ring as training pays for it, against the bare timing the forecast charges.

``tfscale.forecast`` charges multiworker's flat ring (``--node_exchange=collectives``) gRPC's
host time per stack byte, timed bare: four workers all-reducing the model's gradient bytes back
to back, each "node's" two on one core (``python -m tfscale.cli.host_time grpc NBYTES
--flat_ring``). This bench measures the same quantity in training, on one host with no link:

- the 2x2 run: ``tfscale.train --strategy=multiworker --node_exchange=collectives``, four
  TF_CONFIG workers on 127.0.0.1, ranks 0 and 1 pinned to the first core and 2 and 3 to the
  second (the ring's order, as on two one-core nodes);
- its baseline: two 1x2 jobs at the same time, one per core (each node's compute and its
  shared-memory exchange, ``bench.shaped_links``'s 1x2 flags);

and sets the step time the 2x2 run adds over its baseline per byte that one core's ranks put
through the network stack (:func:`tfscale.forecast.model.host_bytes`), beside the bare timing
at the model's size and at 16 MiB. Rounds alternate the order of the 2x2 run and its baseline.
Images/s are each job's after its first progress interval (``bench.shaped_links``).

    python -m bench.grpc_ring_training [--rounds 2] [--models mlp,resnet50]
    python -m bench.grpc_ring_training --report [--result FILE ...]   (rounds pooled)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import (
    ROOT,
    add_report_flags,
    cpu_description,
    gradient_bytes,
    in_round_order,
    print_saved_report,
    save,
    table,
    train_command,
)

SMALL_BYTES = 16 * 2**20  # the message of the other transports' figures (bench.shaped_links)
BASELINE_FLAGS = ("--node_exchange=shared_memory", "--sharded_update=false")


def ns_per_stack_byte(model: str, ring_rate: float, node_rates: Sequence[float],
                      batch_size: int) -> float:
    """Nanoseconds per stack byte that the 2x2 ring at ``ring_rate`` images/s adds to a step
    over one node at the mean of ``node_rates`` (each the images/s of a node's 2 ranks), for
    ``model``'s gradients at ``batch_size`` per rank.

    Raises:
        ValueError: for a rate that is not positive.
    """
    from tfscale.forecast.model import FLAT_RING_LOCAL, FLAT_RING_NODES, host_bytes

    if ring_rate <= 0 or min(node_rates, default=0.0) <= 0:
        raise ValueError(f"images/s must be positive: ring {ring_rate}, nodes {node_rates}")
    per_node = FLAT_RING_LOCAL * batch_size
    step = per_node * FLAT_RING_NODES / ring_rate
    node_step = per_node / statistics.mean(node_rates)
    stack = host_bytes(gradient_bytes(model), "flat", FLAT_RING_LOCAL, FLAT_RING_NODES, "tcp")
    return (step - node_step) / stack * 1e9


def _jobs(model: str, cores: Sequence[int], flags: Sequence[str], tmp: Path
          ) -> list[subprocess.Popen[str]]:
    """One multiworker job of ``len(cores)`` workers, worker ``i`` pinned to ``cores[i]``."""
    from bench.shaped_links import MODELS
    from tfscale.cluster.environment import tf_config_envs

    procs = []
    for i, (core, env) in enumerate(zip(cores, tf_config_envs(len(cores)), strict=True)):
        command = train_command([*MODELS[model], "--strategy=multiworker",
                                 "--learning_rate=0.01", *flags], tmp / f"worker{i}")
        procs.append(subprocess.Popen(
            command, cwd=ROOT, env={**os.environ, **env, "TF_CPP_MIN_LOG_LEVEL": "2"},
            preexec_fn=functools.partial(os.sched_setaffinity, 0, {core}),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    return procs


def _rates(jobs: list[list[subprocess.Popen[str]]], what: str) -> list[float]:
    """Each job's first worker's steady images/s once every worker of every job has ended;
    on a failure, every worker of every job is stopped."""
    from bench.shaped_links import steady_rate

    rates = []
    try:
        for procs in jobs:
            outs = []
            for proc in procs:
                out, err = proc.communicate(timeout=1800)
                if proc.returncode:
                    raise RuntimeError(f"{what}: a worker failed (exit {proc.returncode}):\n"
                                       f"{err[-2000:]}")
                outs.append(out)
            rate = steady_rate(outs[0])
            if rate is None:
                raise RuntimeError(f"{what}: fewer than two progress lines in its output")
            rates.append(rate)
    finally:
        for proc in (proc for procs in jobs for proc in procs):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return rates


def measure(rounds: int, models: list[str]) -> dict[str, Any]:
    from bench.shaped_links import MODELS
    from bench.shaped_links_report import batch_of
    from tfscale.cli.host_time import flat_ring

    runs: list[dict[str, Any]] = []
    for r in range(rounds):
        for model in in_round_order(models, r):
            row: dict[str, Any] = {"round": r, "model": model}
            for part in in_round_order(["ring", "nodes"], r):
                with tempfile.TemporaryDirectory() as tmp:
                    if part == "ring":
                        row["ring_images_per_sec"] = _rates([_jobs(
                            model, [0, 0, 1, 1], ["--node_exchange=collectives"],
                            Path(tmp) / "ring")], f"{model} 2x2")[0]
                    else:
                        row["node_images_per_sec"] = _rates(
                            [_jobs(model, [core, core], BASELINE_FLAGS, Path(tmp) / str(core))
                             for core in (0, 1)], f"{model} 1x2")
            row["training_ns_per_stack_byte"] = ns_per_stack_byte(
                model, row["ring_images_per_sec"], row["node_images_per_sec"],
                batch_of(MODELS[model]))
            row["bare_ns_per_stack_byte"] = flat_ring(gradient_bytes(model))
            row["bare_small_ns_per_stack_byte"] = flat_ring(SMALL_BYTES)
            runs.append(row)
            print(json.dumps(row), flush=True)
    return {"cpu": cpu_description(), "rounds": rounds, "runs": runs}


def report(result: dict[str, Any]) -> str:
    rows = []
    for model in dict.fromkeys(run["model"] for run in result["runs"]):
        runs = [run for run in result["runs"] if run["model"] == model]

        def spread(key: str, runs: list[dict[str, Any]] = runs) -> str:
            values = [run[key] for run in runs]
            return f"{statistics.median(values):.2f} ({min(values):.2f}-{max(values):.2f})"

        rows.append({"model": model, "gradient MB": f"{gradient_bytes(model) / 1e6:.1f}",
                     "rounds": len(runs),
                     "training ns per stack byte": spread("training_ns_per_stack_byte"),
                     "bare, model's size": spread("bare_ns_per_stack_byte"),
                     "bare, 16 MiB": spread("bare_small_ns_per_stack_byte")})
    return (f"CPU: {result['cpu']}; {result['rounds']} round(s); median (range)\n\n"
            + table(rows, list(rows[0])))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--models", default="mlp,resnet50")
    add_report_flags(parser)
    args = parser.parse_args()
    if args.result and not args.report:
        parser.error("--result goes with --report")
    if args.report:
        print_saved_report(parser, args.result, "grpc_ring_training", report)
        return 0
    result = measure(args.rounds, [m.strip() for m in args.models.split(",") if m.strip()])
    save("grpc_ring_training", result)
    print(report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
