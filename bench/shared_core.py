"""Open MPI's wait on a core that ranks share: spinning against yielding, under Horovod's cycle.

Two ranks of ``tfscale.train --strategy=horovod`` (mlp, 32 px, batch 64 each) under ``mpirun
-np 2``, either both on core 0 (``--layout shared``: the mini-cluster's nodes, one core each) or
bound one to a core (``--layout bound``: mpirun's ``--bind-to core``), each run with Open MPI's
waiting rank spinning (``--mca mpi_yield_when_idle 0``, Open MPI's default where it does not
know the node is oversubscribed) and yielding its core (``--mca mpi_yield_when_idle 1``, which
tfscale does not set: tfscale.exchange.setup's note), at Horovod's 5 ms cycle (what runs
across nodes) and at 50 ms (tfscale's one-node default with shared memory). Runs alternate
within each round, forward in odd rounds and backward in even ones; the result is images/s
over the training steps.

    python -m bench.shared_core [--rounds 2 --steps 1000 --layout shared]

About 4 minutes a round on 2 cores. Needs Open MPI's ``mpirun`` (``TFSCALE_WITH_MPI=1 make
setup``).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
from typing import Any

from bench.common import cpu_description, in_round_order, save, table, train

MODEL = ["--model=mlp", "--image_size=32", "--batch_size=64", "--strategy=horovod",
         "--sharded_update=false", "--learning_rate=0.01"]
# name: (Open MPI's mpi_yield_when_idle, Horovod's cycle in ms)
VARIANTS: dict[str, tuple[str, int]] = {
    "spinning, 5 ms cycle": ("0", 5),
    "yielding, 5 ms cycle": ("1", 5),
    "spinning, 50 ms cycle": ("0", 50),
    "yielding, 50 ms cycle": ("1", 50),
}
# layout: (mpirun's binding, the cores the job may use, the node exchange)
LAYOUTS = {"shared": ("none", [0], "shared_memory"), "bound": ("core", None, "collectives")}


def run(layout: str, variant: str, steps: int) -> dict[str, Any]:
    """One run: its images/s over the training steps."""
    bind, cores, node_exchange = LAYOUTS[layout]
    yield_, cycle = VARIANTS[variant]
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        raise SystemExit("bench.shared_core needs Open MPI's mpirun: TFSCALE_WITH_MPI=1 make setup")
    # --mca wins over an OMPI_MCA_ variable in the environment.
    launcher = [mpirun, "--allow-run-as-root", "-np", "2", "--bind-to", bind,
                "--mca", "mpi_yield_when_idle", yield_, "-x", f"HOROVOD_CYCLE_TIME={cycle}"]
    results = train([*MODEL, f"--steps={steps}", f"--log_every={steps}",
                     f"--node_exchange={node_exchange}"], cores=cores, launcher=launcher)
    return {"layout": layout, "run": variant, "images_per_sec": results["images_per_sec"]}


def measure(rounds: int, steps: int, layout: str) -> dict[str, Any]:
    rows = []
    for round_ in range(1, rounds + 1):
        for variant in in_round_order(list(VARIANTS), round_ - 1):
            rows.append({"round": round_, **run(layout, variant, steps)})
    means = {v: statistics.mean(r["images_per_sec"] for r in rows if r["run"] == v)
             for v in VARIANTS}
    summary = [{"run": v, "images_per_sec": rate,
                "vs spinning at 5 ms": rate / means["spinning, 5 ms cycle"]}
               for v, rate in means.items()]
    return {"cpu": cpu_description(), "rows": rows, "summary": summary,
            "setup": {"layout": layout, "steps": steps, "rounds": rounds,
                      "command": " ".join(MODEL)}}


def report(result: dict[str, Any]) -> str:
    setup = result["setup"]
    where = ("both on core 0" if setup["layout"] == "shared"
             else "one to a core (mpirun --bind-to core)")
    return "\n".join([
        f"CPU: {result['cpu']}", "",
        f"Two ranks {where}: `mpirun -np 2 python -m tfscale.train {setup['command']}`, "
        f"{setup['steps']} steps, rounds alternating.", "",
        table(result["rows"], ["round", "run", "images_per_sec"]), "",
        table(result["summary"], ["run", "images_per_sec", "vs spinning at 5 ms"]),
    ])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--layout", choices=sorted(LAYOUTS), default="shared")
    args = parser.parse_args()
    result = measure(args.rounds, args.steps, args.layout)
    save(f"shared_core_{args.layout}", result)
    print(report(result))


if __name__ == "__main__":
    main()
