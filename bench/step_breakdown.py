"""Where a training step's milliseconds go, for each multi-process strategy, 1 and 2 workers.

For ``mlp`` (communication-bound: 7.4 MB of gradients for ~5 ms of compute on one core), each
worker bound to its own core with one TensorFlow thread of each kind, one run of
:mod:`bench.step_breakdown_worker` per strategy and worker count measures in the workers
themselves (rank 0's figures):

- ``compute``: forward, backward and update with no exchange;
- ``step``: the strategy's step, gradient exchange included; ``exchange`` = step - compute;
- ``step_lag``: the step with ``--gradient_lag=1`` (Horovod strategies);
- ``allreduce``: a bare all-reduce of the gradients' bytes, the exchange's floor here: the
  strategy's own all-reduce (shared memory where ``--node_exchange`` takes it; ddl's
  hierarchical one), or its transport's (Horovod's Gloo, TensorFlow's gRPC ring) for the
  ``*_collectives`` variants;
- ``host_allreduce``: one collective on two host numbers (what the guard runs every step);
- ``read_step``: reading the step counter back to Python.

Then ``python -m tfscale.train`` runs the same model, batch and binding for ``--steps`` steps;
``framework`` = its step time - ``step``: callbacks, host synchronisation, the guard's
collective, metrics and data. ``default`` runs through ``tfscale.train`` on one core in every
round, the baseline of the targets. The memory-copy bandwidth of this machine is measured in the
same run. Everything alternates over ``--rounds``; figures are means.

    python -m bench.step_breakdown [--rounds 2 --steps 200
                                    --strategies horovod,ddl,multiworker,horovod_collectives,...]

About 11 minutes on 2 cores with 2 rounds (6 runs: 3 strategies, each with and without shared
memory).
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import tempfile
from typing import Any

from bench.common import cpu_description, memcpy_gbps, save, table, train
from tfscale.scripts.launcher import horovod_envs, node_layout, supervise, tf_config_envs

PARTS = ("compute", "step", "step_lag", "allreduce", "host_allreduce", "read_step")
# The model the workers time (bench.step_breakdown_worker's defaults): the same classes, so the
# same gradient bytes, in tfscale.train's run.
MLP = ["--model=mlp", "--image_size=32", "--num_classes=10", "--batch_size=64",
       "--intra_op_threads=1", "--inter_op_threads=1"]


# Runs measured besides the strategies themselves: name -> (strategy, flags of both the worker
# and tfscale.train). The workers share one node, as with --num_processes; "X_collectives" is X
# with its exchange on its own transport (Horovod's Gloo, TensorFlow's gRPC ring) instead of
# shared memory.
VARIANTS = {f"{name}_collectives": (name, ["--node_exchange=collectives"])
            for name in ("horovod", "ddl", "multiworker")}
DEFAULT_RUNS = "horovod,ddl,multiworker,horovod_collectives,ddl_collectives,multiworker_collectives"


def variant(name: str) -> tuple[str, list[str]]:
    return VARIANTS.get(name, (name, []))


def worker_parts(name: str, workers: int, steps: int) -> dict[str, Any]:
    """Runs the breakdown worker as ``workers`` local processes; returns rank 0's figures."""
    strategy, flags = variant(name)
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "bench.step_breakdown_worker", f"--strategy={strategy}",
                   f"--steps={steps}", f"--model_dir={tmp}", *flags]
        log = io.StringIO()
        if strategy == "multiworker":
            code = supervise(command, tf_config_envs(workers), out=log)
        else:  # horovod, ddl: all workers on one node
            envs, server = horovod_envs(node_layout(workers, workers))
            code = supervise(command, envs, out=log, on_exit=server.stop)
    lines = [line.split("BREAKDOWN ", 1)[1] for line in log.getvalue().splitlines()
             if "BREAKDOWN " in line]
    if code or not lines:
        raise RuntimeError(f"{name} x{workers} failed ({code}):\n{log.getvalue()[-3000:]}")
    parts: dict[str, Any] = json.loads(lines[0])
    return parts


def trained_step_ms(name: str, workers: int, steps: int) -> float:
    """The step time ``python -m tfscale.train`` reports for the same work."""
    strategy, extra = variant(name)
    flags = [*MLP, f"--strategy={strategy}", f"--steps={steps}", f"--log_every={steps}", *extra]
    if workers > 1:
        flags += [f"--num_processes={workers}", "--cpu_binding"]
    results = train(flags, cores=[0] if workers == 1 else None)
    return float(results["step_time_ms"])


def measure(rounds: int, steps: int, strategies: list[str]) -> dict[str, Any]:
    rows: list[dict[str, Any]] = []
    copies = []
    defaults = []
    for round_ in range(1, rounds + 1):
        copies.append(memcpy_gbps())
        defaults.append(trained_step_ms("default", 1, steps))
        for strategy in strategies:
            for workers in (1, 2):
                parts = worker_parts(strategy, workers, steps)
                parts["train"] = trained_step_ms(strategy, workers, steps)
                rows.append({"round": round_, "strategy": strategy, **parts})
    summary = []
    for strategy in strategies:
        for workers in (1, 2):
            mine = [r for r in rows if r["strategy"] == strategy and r["workers"] == workers]
            mean = {k: statistics.mean(r[k] for r in mine) for k in (*PARTS, "train")
                    if all(k in r for r in mine)}
            summary.append({
                "run": f"{strategy} x{workers}", **mean,
                "exchange": mean["step"] - mean["compute"],
                "framework": mean["train"] - mean["step"],
                "vs default": mean["train"] / statistics.mean(defaults),
                "efficiency": statistics.mean(defaults) / mean["train"],
                "floor_efficiency": mean["compute"] / (mean["compute"] + mean["allreduce"])
                if workers > 1 else 1.0,
            })
    return {"cpu": cpu_description(), "memcpy_gbps": statistics.mean(copies),
            "default_train_ms": statistics.mean(defaults), "default_rounds": defaults,
            "gradient_megabytes": rows[0]["gradient_megabytes"], "rows": rows,
            "summary": summary,
            "setup": {"model": "mlp", "batch_size_per_worker": 64, "image_size": 32,
                      "steps": steps, "rounds": rounds, "threads_per_worker": 1}}


def report(result: dict[str, Any]) -> str:
    columns = ["run", "compute", "step", "exchange", "step_lag", "allreduce", "host_allreduce",
               "read_step", "train", "framework", "vs default", "efficiency", "floor_efficiency"]
    return "\n".join([
        f"CPU: {result['cpu']}; memory copy {result['memcpy_gbps']:.1f} GB/s; gradients "
        f"{result['gradient_megabytes']:.1f} MB per step", "",
        f"milliseconds per step (mean over rounds). `python -m tfscale.train --strategy=default` "
        f"on one core: {result['default_train_ms']:.2f} ms a step. vs default = train / default's "
        "train step (targets: <= 1.05 with 1 worker); efficiency = default's train step / train "
        "step (weak scaling; target >= 0.70 with 2 workers); floor_efficiency = compute / "
        "(compute + bare all-reduce), the best a step that does not overlap its exchange can "
        "reach here", "",
        table(result["summary"], columns),
    ])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--strategies", default=DEFAULT_RUNS,
                        help=f"strategies, or these variants: {sorted(VARIANTS)}")
    args = parser.parse_args()
    result = measure(args.rounds, args.steps, args.strategies.split(","))
    save("step_breakdown", result)
    print(report(result))


if __name__ == "__main__":
    main()
