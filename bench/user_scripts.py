"""Users' own scripts against ``tfscale.train``: weak-scaling efficiency on 2 workers.

The comm-bound ``mlp`` of bench/scaling.py (batch 64 per worker, every worker pinned to its own
core; the one-process baseline pinned to one core) trained by:

- ``tfscale.train --strategy=default`` in one process, and the Horovod-style script as one
  rank: the baselines;
- ``tfscale.train --strategy=horovod|multiworker --num_processes=2 --cpu_binding``;
- a Horovod-style script on ``tfscale.horovod`` (bench/user_hvd_mlp.py) and a TF-tutorial
  MWMS script with ``tfscale.multiworker.enable()`` (bench/user_mwms_mlp.py), each started on
  2 local workers by tfscale's launcher (``tfscale.scripts.launcher``: Horovod's Gloo rendezvous,
  or a
  TF_CONFIG per worker) and pinned with ``taskset``, as a cluster launcher binds ranks;
- with ``--before``, the same scripts with ``TFSCALE_NODE_EXCHANGE=collectives``: their
  gradients on Gloo and gRPC over loopback, as before users' scripts took the node exchange.

Efficiency = the 2-worker rate / (2 x the one-process rate of the same program), both means
over the rounds: tfscale.train's one process for tfscale.train, the Horovod-style script run as
one rank (its optimizer then exchanges nothing: plain Keras) for the scripts, so that what a
program does in one process, and not its exchange, does not move its efficiency. Every case
runs once per round, the rounds in alternating order.

    python -m bench.user_scripts [--rounds 3 --before]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import statistics
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.common import ROOT, cpu_description, in_round_order, save, table, train

STEPS = 200
MLP = ["--model=mlp", "--image_size=32", "--batch_size=64", f"--steps={STEPS}",
       f"--log_every={STEPS}", "--learning_rate=0.01"]
SCRIPTS = {"horovod": "bench.user_hvd_mlp", "mwms": "bench.user_mwms_mlp"}


def run_script(style: str, cores: list[int], mode: str = "auto") -> float:
    """images/s of the user script of ``style`` on ``len(cores)`` local workers, worker ``i``
    pinned to ``cores[i]``, with ``TFSCALE_NODE_EXCHANGE=mode``."""
    from tfscale.scripts.launcher import horovod_envs, supervise, tf_config_envs

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        command = ["sh", "-c", 'exec taskset -c "$BENCH_CORE" "$0" "$@"', sys.executable,
                   "-m", SCRIPTS[style], f"--out={out}", f"--steps={STEPS}"]
        stop: Callable[[], None] | None = None
        if style == "horovod":
            envs, server = horovod_envs([("localhost", len(cores))])
            stop = server.stop
        else:
            envs = tf_config_envs(len(cores))
        for env, core in zip(envs, cores, strict=True):
            env.update(BENCH_CORE=str(core), TFSCALE_NODE_EXCHANGE=mode)
        log = io.StringIO()
        cwd = os.getcwd()
        os.chdir(ROOT)
        try:
            code = supervise(command, envs, out=log, on_exit=stop)
        finally:
            os.chdir(cwd)
        if code != 0:
            raise RuntimeError(f"{SCRIPTS[style]} failed ({code}):\n{log.getvalue()[-3000:]}")
        rate: float = json.loads(out.read_text())["images_per_sec"]
        return rate


TRAIN_ONE = "one process: tfscale.train --strategy=default"
SCRIPT_ONE = "one process: the Horovod-style script, 1 rank (plain Keras underneath)"


def cases(before: bool) -> dict[str, tuple[int, str, Callable[[list[int]], float]]]:
    """Name -> (workers, the one-process case it is measured against, a function of the
    cores, one per worker, that returns images/s)."""
    def tfscale_train(strategy: str) -> Callable[[list[int]], float]:
        def run(cores: list[int]) -> float:
            flags = [*MLP, f"--strategy={strategy}", f"--num_processes={len(cores)}"]
            if len(cores) > 1:
                flags.append("--cpu_binding")
            rate: float = train(flags, cores=cores)["images_per_sec"]
            return rate
        return run

    found: dict[str, tuple[int, str, Callable[[list[int]], float]]] = {
        TRAIN_ONE: (1, TRAIN_ONE, tfscale_train("default")),
        SCRIPT_ONE: (1, SCRIPT_ONE, lambda c: run_script("horovod", c)),
        "tfscale.train --strategy=horovod --num_processes=2": (
            2, TRAIN_ONE, tfscale_train("horovod")),
        "tfscale.train --strategy=multiworker --num_processes=2": (
            2, TRAIN_ONE, tfscale_train("multiworker")),
        "Horovod-style script (tfscale.horovod)": (
            2, SCRIPT_ONE, lambda c: run_script("horovod", c)),
        "MWMS-style script (tfscale.multiworker.enable())": (
            2, SCRIPT_ONE, lambda c: run_script("mwms", c)),
    }
    if before:
        found["Horovod-style script, TFSCALE_NODE_EXCHANGE=collectives (Gloo)"] = (
            2, SCRIPT_ONE, lambda c: run_script("horovod", c, "collectives"))
        found["MWMS-style script, TFSCALE_NODE_EXCHANGE=collectives (gRPC)"] = (
            2, SCRIPT_ONE, lambda c: run_script("mwms", c, "collectives"))
    return found


def measure(rounds: int, before: bool) -> dict[str, Any]:
    available = sorted(os.sched_getaffinity(0))
    if len(available) < 2:
        raise SystemExit(f"bench.user_scripts needs 2 cores; this process may use {available}")
    runs = cases(before)
    names = list(runs)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(rounds):
        for name in in_round_order(names, round_):
            workers, _, run = runs[name]
            rates[name].append(run(available[:workers]))
            print(f"round {round_ + 1}: {name}: {rates[name][-1]:.0f} images/s", flush=True)
    rows = []
    for name in names:
        workers, baseline, _ = runs[name]
        mean, one = statistics.mean(rates[name]), statistics.mean(rates[baseline])
        rows.append({"run": name, "rounds": len(rates[name]), "images/s": mean,
                     "range": f"{min(rates[name]):.0f}-{max(rates[name]):.0f}",
                     "efficiency": mean / (workers * one),
                     "vs tfscale.train's one process": mean / (
                         workers * statistics.mean(rates[TRAIN_ONE])),
                     "efficiency per round": ", ".join(
                         f"{r / (workers * one):.2f}" for r in rates[name])})
    return {"cpu": cpu_description(), "steps": STEPS, "rates": rates, "rows": rows}


def report(result: dict[str, Any]) -> str:
    rows = {r["run"]: r for r in result["rows"]}
    lines = [table(result["rows"], ["run", "rounds", "images/s", "range", "efficiency",
                                    "efficiency per round", "vs tfscale.train's one process"]),
             "",
             f"CPU: {result['cpu']}. Rates are means over the rounds. Efficiency = the rate / "
             "(workers x the rate of the same program in one process: tfscale.train's for "
             "tfscale.train, the Horovod-style script's for the scripts).",
             ]
    for script, reference in (("Horovod-style script (tfscale.horovod)",
                               "tfscale.train --strategy=horovod --num_processes=2"),
                              ("MWMS-style script (tfscale.multiworker.enable())",
                               "tfscale.train --strategy=multiworker --num_processes=2")):
        ratio = rows[script]["efficiency"] / rows[reference]["efficiency"]
        lines.append(f"{script}: {ratio:.3f} of {reference}'s efficiency "
                     f"(target >= 0.95: {'met' if ratio >= 0.95 else 'NOT met'})")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--before", action=argparse.BooleanOptionalAction, default=True,
                        help="also run the scripts with TFSCALE_NODE_EXCHANGE=collectives")
    args = parser.parse_args()
    result = measure(args.rounds, args.before)
    save("user_scripts", result)
    print(report(result))


if __name__ == "__main__":
    main()
