"""Statistical efficiency: final accuracy and optimizer steps to a target against the global batch.

On two real small datasets shipped inside registry packages, scikit-learn's digits
(:mod:`bench.digits`: 1,438 / 359 grey 32-px images, 10 classes, 8 epochs) and scikit-image's
textures (:mod:`bench.textures`: 615 / 153 tiles, 3 classes, 16 epochs, about as many images),
``resnet50_tiny`` with SGD (momentum 0.9) and a cosine decay. Every run of a dataset sees the
same images (a larger batch takes fewer steps) and is evaluated on the whole validation split
every 1/16 of its steps: epochs and steps to the target are measured at that granularity.

Global batches 16 to 256 emulate 1 to 16 workers of 16 images with ``--grad_accum_steps=G/16``
(batch norm normalizes each micro-batch of 16 on its own). The arms (:data:`ARMS`): ``linear``
(``--lr_scaling=linear``: 0.0125 per 16 images, the issue's 0.05 at 64, warmed up over the
issue's 20/176 of the steps), ``constant`` (0.05 at every batch, no warmup), Keras' moving
averages against precise statistics, the recipe pieces, and real workers at a global batch of 64
with the issue's flags. Accumulation updates the moving averages once per micro-batch, G/16 times
per step, where each worker updates its own once per step: the ``ema one process`` arm (one
process at ``--batch_size=G``) has the workers' staleness; ``ema accumulated`` has accumulation's.

Writes ``bench/results/statistical_scaling.json`` after every run (``--append`` resumes),
prints a table per dataset, draws ``docs/statistical_scaling/accuracy.png`` (Goyal et al. 2017)
and ``steps.png`` (Shallue et al. 2019), and writes the forecast's statistical-efficiency files
``tfscale/forecast/data/efficiency_<dataset>.json`` from :data:`EFFICIENCY_ARM`, the ``linear``
arm with today's default ``--zero_init_residual``.

    python -m bench.statistical_scaling [--datasets digits] [--arms linear] [--seeds 0]
        [--batches 16,256] [--append] [--report_only] [--target digits=0.95]

About 3 hours on 2 shared cores. Needs scikit-learn's data file, scikit-image
(requirements-bench.txt) and Horovod.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench import digits, textures
from bench.accuracy import first_at, mean
from bench.common import OUT, ROOT, cpu_description, save, table, train
from tfscale.training.files import write_json_atomic

NAME = "statistical_scaling"
DOCS = ROOT / "docs" / "statistical_scaling"
EFFICIENCY = ROOT / "tfscale" / "forecast" / "data"
# The arm the forecast's efficiency files come from: the linear arm's recipe with today's
# defaults (zero-init residual scales on; the linear arm itself ran before they were).
EFFICIENCY_ARM = "zero-init residual"
MODEL = "resnet50_tiny"
PER_WORKER = 16  # images per worker (micro-batch) in the emulation
BATCHES = (16, 32, 64, 128, 256)
REFERENCE_BATCH, REFERENCE_LR = 64, 0.05  # the run
WARMUP_FRACTION = 20 / 176  # the 20 warmup steps of 176
EVALUATIONS = 16
WEIGHT_DECAY = 0.005  # Keras' decoupled decay (x the learning rate): ~5e-4 L2 under momentum 0.9
EFFICIENT = 0.8  # perfect scaling: steps within 1/0.8 of the perfect-scaling line


@dataclasses.dataclass(frozen=True)
class Dataset:
    prepare: Callable[[Path], Path]
    epochs: int


DATASETS = {"digits": Dataset(digits.prepare, 8), "textures": Dataset(textures.prepare, 16)}


@dataclasses.dataclass(frozen=True)
class Arm:
    """One line of the comparison: how each global batch of it is trained."""

    label: str
    bn: str = "precise"  # --bn_statistics; "" leaves the default
    lr: str = "linear"  # linear: scaled per 16 images with warmup; constant: 0.05, no warmup
    layout: str = "accumulate"  # accumulate (16 x G/16), batch (one process at G), workers
    flags: tuple[str, ...] = ()
    batches: tuple[int, ...] = BATCHES
    seeds: tuple[int, ...] = (0, 1)
    datasets: tuple[str, ...] = tuple(DATASETS)
    workers: int = 1  # layout "workers": processes sharing the global batch
    # --zero_init_residual: every arm but its own ran while it was off by default, and says so
    # now that it is on (None: today's default, for the "... now" arms).
    zero_init: bool | None = False
    first: bool = False  # measured before the other arms (the main result and the acceptance)


def _workers(label: str, strategy: str, workers: int, datasets: tuple[str, ...] = tuple(DATASETS),
             seeds: tuple[int, ...] = (0, 1, 2), flags: tuple[str, ...] = (),
             zero_init: bool | None = False) -> Arm:
    return Arm(label, bn="", layout="workers", flags=(f"--strategy={strategy}", *flags),
               batches=(REFERENCE_BATCH,), seeds=seeds, datasets=datasets, workers=workers,
               first=True, zero_init=zero_init)


def _now(strategy: str, workers: int) -> Arm:
    """The issue's command with today's default flags (zero-init residual on)."""
    name = "one process" if workers == 1 else f"{strategy} x{workers}"
    return _workers(f"{name}, default flags since zero-init", strategy, workers,
                    zero_init=None)


DECAY = (f"--weight_decay={WEIGHT_DECAY:g}",)
ARMS = {
    "linear": Arm("precise BN, linear LR scaling + warmup", seeds=(0, 1, 2), first=True),
    "one process": _workers("one process, default flags", "default", 1),
    "horovod x1": _workers("horovod x1, default flags", "horovod", 1),
    "horovod x2": _workers("horovod x2, default flags", "horovod", 2),
    "horovod x4": _workers("horovod x4, default flags", "horovod", 4),
    "multiworker x4": _workers("multiworker x4, default flags", "multiworker", 4, ("digits",),
                               (0,)),
    "ema one process": Arm("EMA BN, one process at the global batch", bn="ema", layout="batch",
                           batches=(16, 64, 256)),
    "precise one process": Arm("precise BN, one process at the global batch", layout="batch",
                               batches=(256,)),
    "constant": Arm("precise BN, LR 0.05 at every batch, no warmup", lr="constant",
                    batches=(16, 256)),
    "weight decay": Arm(f"precise BN, linear, weight decay {WEIGHT_DECAY:g}", flags=DECAY,
                        batches=(128,), datasets=("digits",)),
    "weight decay + exclude": Arm(
        f"precise BN, linear, weight decay {WEIGHT_DECAY:g} + --exclude_bias_bn_decay",
        flags=(*DECAY, "--exclude_bias_bn_decay"), batches=(128,), datasets=("digits",)),
    # Today's defaults: the linear arm with zero-init residual scales. 128 on the digits first,
    # then 64 and 256 there and 128 on the textures (2 seeds); every batch and a third seed
    # later, for the forecast's efficiency files (EFFICIENCY_ARM).
    "zero-init residual": Arm("precise BN, linear, --zero_init_residual", zero_init=True,
                              seeds=(0, 1, 2)),
    "ema accumulated": Arm("EMA BN, accumulation", bn="ema", batches=(128,), seeds=(0,),
                           datasets=("digits",)),
    # Slow on 2 cores (a batch-norm all-reduce per layer and step): 2 seeds, a third on the
    # digits with --seeds 2.
    "horovod x4 sync_bn": _workers("horovod x4 --sync_bn, default flags", "horovod", 4,
                                   seeds=(0, 1), flags=("--sync_bn",)),
    "one process now": _now("default", 1),
    "horovod x2 now": _now("horovod", 2),
    "horovod x4 now": _now("horovod", 4),
}


def budget_steps(epochs: int, examples: int, batch: int) -> int:
    """Optimizer steps of ``epochs`` passes over ``examples`` at a global ``batch`` (rounded)."""
    return max(1, round(epochs * examples / batch))


def warmup_steps(steps: int) -> int:
    """The issue's warmup (20 of 176 steps) as the same fraction of ``steps``."""
    return max(1, round(steps * WARMUP_FRACTION))


def run_flags(arm: Arm, epochs: int, examples: int, batch: int, seed: int,
              data_dir: Path) -> list[str]:
    """tfscale.train flags of one run of ``arm`` at a global ``batch``."""
    flags = [f"--model={MODEL}", f"--data_dir={data_dir}", "--lr_schedule=cosine",
             "--log_every=100000", f"--seed={seed}", *arm.flags]
    if arm.bn:
        flags.append(f"--bn_statistics={arm.bn}")
    if arm.zero_init is not None:
        flags.append("--zero_init_residual" if arm.zero_init else "--nozero_init_residual")
    if arm.layout == "workers":  # the command: --epochs, one evaluation per epoch
        steps = epochs * (examples // batch)
        return [*flags, f"--num_processes={arm.workers}", f"--batch_size={batch // arm.workers}",
                f"--epochs={epochs}", f"--learning_rate={REFERENCE_LR:g}",
                f"--warmup_steps={warmup_steps(steps)}"]
    steps = budget_steps(epochs, examples, batch)
    if arm.layout == "accumulate":
        flags += [f"--batch_size={PER_WORKER}", f"--grad_accum_steps={batch // PER_WORKER}"]
    else:
        flags.append(f"--batch_size={batch}")
    if arm.lr == "linear":
        # --lr_scaling=linear multiplies the rate by the micro-batches per step (G/16); one
        # process at a batch of G has none, so it is given the scaled rate itself.
        per_16 = REFERENCE_LR * PER_WORKER / REFERENCE_BATCH
        rate = per_16 if arm.layout == "accumulate" else per_16 * batch / PER_WORKER
        flags += [f"--learning_rate={rate:g}", f"--warmup_steps={warmup_steps(steps)}"]
        if arm.layout == "accumulate":
            flags.append("--lr_scaling=linear")
    else:
        flags.append(f"--learning_rate={REFERENCE_LR:g}")
    return [*flags, f"--steps={steps}", f"--epochs={min(EVALUATIONS, steps)}"]


def history(results: dict[str, Any], batch: int, examples: int) -> list[dict[str, Any]]:
    """Each evaluation of a run's results.json: its step, epochs of data seen, accuracy."""
    return [{"step": e["step"], "epochs": e["step"] * batch / examples,
             "val_accuracy": e["metrics"]["val_accuracy"]} for e in results["evaluations"]]


def one_run(dataset: str, name: str, batch: int, seed: int, data_dir: Path,
            examples: int) -> dict[str, Any]:
    arm = ARMS[name]
    flags = run_flags(arm, DATASETS[dataset].epochs, examples, batch, seed, data_dir)
    start = time.time()
    results = train(flags, timeout=3600)
    curve = history(results, batch, examples)
    return {"dataset": dataset, "arm": name, "global_batch": results["global_batch_size"],
            "seed": seed, "steps": results["steps"], "train_examples": examples,
            "validation_examples": results["evaluations"][-1]["examples"],
            "final": curve[-1]["val_accuracy"], "history": curve,
            "train_seconds": results["train_seconds"], "wall_seconds": time.time() - start,
            "date": datetime.date.today().isoformat(), "flags": " ".join(flags)}


def key(run: dict[str, Any]) -> tuple[str, str, int, int]:
    return run["dataset"], run["arm"], run["global_batch"], run["seed"]


def plan(datasets: Sequence[str], arms: Sequence[str], seeds: Sequence[int] | None,
         batches: Sequence[int] | None) -> list[tuple[str, str, int, int]]:
    """(dataset, arm, global batch, seed) of every run: the ``first`` arms before the others, and
    seeds outermost within each (an interrupted bench has every configuration once before it has
    any twice); each arm's own batches and seeds unless ``seeds`` and ``batches`` narrow them."""
    every = sorted({s for a in arms for s in ARMS[a].seeds} | set(seeds or ()))
    return [(d, a, b, s) for first in (True, False) for s in every for d in datasets
            for a in arms if ARMS[a].first == first and d in ARMS[a].datasets
            and s in (seeds or ARMS[a].seeds)
            for b in ARMS[a].batches if not batches or b in batches]


def pick_target(runs: Sequence[dict[str, Any]], margin: float = 0.02) -> float:
    """The target accuracy: ``margin`` below the best mean final accuracy of the ``linear`` arm
    at any batch (the main result; an arm that gains much, as zero-init did, would put the
    target beyond the main arm's reach and leave its steps plot empty), rounded down to a
    whole point."""
    best = max(mean([r["final"] for r in group]) for (arm, _), group in groups(runs).items()
               if arm == "linear")
    return math.floor(100 * (best - margin) + 1e-9) / 100


def groups(runs: Sequence[dict[str, Any]]) -> dict[tuple[str, int], list[dict[str, Any]]]:
    """The runs by (arm, global batch), in the order of :data:`ARMS` and batch."""
    out: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for run in sorted(runs, key=lambda r: (list(ARMS).index(r["arm"]), r["global_batch"])):
        out.setdefault((run["arm"], run["global_batch"]), []).append(run)
    return out


def summarize(runs: Sequence[dict[str, Any]], target: float) -> dict[str, Any]:
    """One row over the seeds of one (arm, batch): mean and range of the final accuracy, how many
    reached ``target``, mean epochs and steps to it over those that did."""
    finals = [r["final"] for r in runs]
    reached = [h for h in (first_at(r["history"], target) for r in runs) if h]
    return {
        "arm": runs[0]["arm"], "global batch": runs[0]["global_batch"], "steps": runs[0]["steps"],
        "seeds": len(runs), "final acc (mean)": mean(finals),
        "min-max": f"{min(finals):.3f}-{max(finals):.3f}",
        "reached": f"{len(reached)}/{len(runs)}",
        "epochs to target": mean([h["epochs"] for h in reached]) if reached else None,
        "steps to target": mean([h["step"] for h in reached]) if reached else None,
        "wall s": mean([r["wall_seconds"] for r in runs]),
    }


def perfect_scaling_end(points: Sequence[tuple[int, float | None]]) -> int | None:
    """The largest global batch up to which every batch reached the target in at most
    1/:data:`EFFICIENT` times the steps of perfect scaling (steps x batch constant, from the
    smallest batch); None when the smallest batch did not reach it."""
    ordered = sorted(points, key=lambda p: p[0])
    base_batch, base_steps = ordered[0] if ordered else (0, None)
    if base_steps is None:
        return None
    end = base_batch
    for batch, steps in ordered[1:]:
        if steps is None or base_steps * base_batch / (batch * steps) < EFFICIENT:
            break
        end = batch
    return end


def efficiency_file(dataset: str, runs: Sequence[dict[str, Any]], target: float,
                    source: str, arm_name: str = EFFICIENCY_ARM) -> dict[str, Any]:
    """The statistical-efficiency file that ``tfscale.forecast --efficiency`` reads
    (:mod:`tfscale.forecast.efficiency`), from the runs of arm ``arm_name``."""
    points = []
    for (arm, batch), group in groups(runs).items():
        if arm != arm_name:
            continue
        reached = [h for h in (first_at(r["history"], target) for r in group) if h]
        points.append({
            "global_batch": batch,
            "epochs_to_target": (round(mean([h["epochs"] for h in reached]), 3) if reached
                                 else None),
            "steps_to_target": round(mean([h["step"] for h in reached])) if reached else None,
            "seeds": len(group), "reached": len(reached)})
    return {"dataset": dataset, "model": MODEL,
            "target": {"metric": "val_accuracy", "value": target}, "source": source,
            "per_worker_batch": PER_WORKER, "train_images": runs[0]["train_examples"],
            "points": points}


def _panels(count: int) -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, count, figsize=(6.2 * count, 5.4), squeeze=False)
    return fig, axes[0]


def _batch_axis(ax: Any) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(BATCHES, [str(b) for b in BATCHES])
    ax.minorticks_off()
    ax.set_xlabel("global batch (16 per emulated worker)")
    ax.grid(alpha=0.3)


def _finish(fig: Any, title: str, cpu: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.suptitle(f"{title}\nresnet50_tiny; CPU: {cpu}", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


STYLE = {"linear": ("C0", "o", "-"), "constant": ("C1", "s", "-"),
         "ema one process": ("C3", "v", "--"), "precise one process": ("C2", "^", "--"),
         "ema accumulated": ("C4", "D", ""), "weight decay": ("C5", "P", ""),
         "weight decay + exclude": ("C6", "X", ""), "zero-init residual": ("C7", "*", "-")}


def plot_accuracy(by_dataset: dict[str, list[dict[str, Any]]], targets: dict[str, float],
                  cpu: str, path: Path) -> None:
    """Goyal et al. (2017) fig. 1 style: final validation accuracy against the global batch, one
    line per arm (mean over seeds, bars from the lowest to the highest seed)."""
    fig, axes = _panels(len(by_dataset))
    for ax, (dataset, runs) in zip(axes, by_dataset.items(), strict=True):
        lines: dict[str, list[tuple[int, list[float]]]] = {}
        for (arm, batch), group in groups(runs).items():
            if arm in STYLE:
                lines.setdefault(arm, []).append((batch, [r["final"] for r in group]))
        for number, (arm, points) in enumerate(lines.items()):
            color, marker, style = STYLE[arm]
            # A small shift per arm keeps bars at the same batch apart.
            xs = [b * 2 ** (0.04 * (number - len(lines) / 2)) for b, _ in points]
            ys = [mean(v) for _, v in points]
            low = [y - min(v) for y, (_, v) in zip(ys, points, strict=True)]
            high = [max(v) - y for y, (_, v) in zip(ys, points, strict=True)]
            ax.errorbar(xs, ys, yerr=[low, high], color=color, marker=marker, linestyle=style,
                        capsize=3, markersize=6, label=f"{ARMS[arm].label} ({len(points[0][1])}"
                        " seeds)")
        ax.axhline(targets[dataset], color="grey", linestyle=":", linewidth=1)
        ax.text(BATCHES[0], targets[dataset], f" target {targets[dataset]:g}", fontsize=8,
                va="bottom", color="grey")
        _batch_axis(ax)
        ax.set_ylabel("final validation accuracy (whole split)")
        ax.set_title(f"{dataset}: {DATASETS[dataset].epochs} epochs at every batch")
        ax.legend(fontsize=7, loc="lower left")
    _finish(fig, "Final accuracy against the global batch (Goyal et al. 2017 style)", cpu, path)


def plot_steps(by_dataset: dict[str, list[dict[str, Any]]], targets: dict[str, float], cpu: str,
               path: Path,
               arms: Sequence[str] = ("linear", "constant", "zero-init residual")) -> None:
    """Shallue et al. (2019) fig. 1 style: optimizer steps to the target against the global batch,
    log-log, mean over the seeds that reached it (hollow: not every seed did; a cross at the top:
    none did), with the step budget, the perfect-scaling line through the smallest batch of
    ``linear`` and the batch after which perfect scaling ends."""
    fig, axes = _panels(len(by_dataset))
    for ax, (dataset, runs) in zip(axes, by_dataset.items(), strict=True):
        rows = [summarize(g, targets[dataset]) for g in groups(runs).values()]
        budget = {r["global batch"]: r["steps"] for r in rows if r["arm"] == "linear"}
        top = max(budget.values()) * 1.6
        ax.plot(list(budget), list(budget.values()), "--", color="grey", linewidth=1,
                label=f"step budget ({DATASETS[dataset].epochs} epochs)")
        for arm in arms:
            mine = [r for r in rows if r["arm"] == arm]
            color, marker, style = STYLE[arm]
            hit = [r for r in mine if r["steps to target"] is not None]
            ax.plot([r["global batch"] for r in hit], [r["steps to target"] for r in hit],
                    color=color, linestyle=style, label=ARMS[arm].label)
            for r in hit:
                full = r["reached"].split("/")[0] == r["reached"].split("/")[1]
                ax.plot(r["global batch"], r["steps to target"], marker, color=color,
                        markerfacecolor=color if full else "none", markersize=7)
            missed = [r["global batch"] for r in mine if r["steps to target"] is None]
            ax.plot(missed, [top] * len(missed), "x", color=color, markersize=9)
        linear = {r["global batch"]: r["steps to target"] for r in rows if r["arm"] == "linear"}
        first = min(linear, default=None)
        if first is not None and linear[first] is not None:
            ax.plot(BATCHES, [linear[first] * first / b for b in BATCHES], ":", color="black",
                    linewidth=1, label="perfect scaling (steps x batch constant)")
            end = perfect_scaling_end(list(linear.items()))
            if end is not None and end < max(linear):
                ax.axvline(end * 2 ** 0.5, color="grey", linewidth=0.8)
                ax.text(end * 2 ** 0.5, top, f" perfect scaling\n ends after {end}", fontsize=8,
                        color="grey", va="top")
        ax.set_yscale("log")
        ax.set_ylim(top=top * 1.4)
        _batch_axis(ax)
        ax.set_ylabel(f"optimizer steps to val_accuracy >= {targets[dataset]:g}")
        ax.set_title(f"{dataset} (x at the top: no seed reached the target)")
        ax.legend(fontsize=7, loc="lower left")
    _finish(fig, "Steps to the target against the global batch (Shallue et al. 2019 style)",
            cpu, path)


def report(result: dict[str, Any], targets: dict[str, float]) -> str:
    columns = ["arm", "global batch", "steps", "seeds", "final acc (mean)", "min-max", "reached",
               "epochs to target", "steps to target", "wall s"]
    parts = [f"CPU: {result['cpu']}"]
    for dataset, rows in result["rows"].items():
        lines = [{**r, "epochs to target": r["epochs to target"] or "-",
                  "steps to target": r["steps to target"] or "-"} for r in rows]
        linear = [(r["global batch"], r["steps to target"]) for r in rows if r["arm"] == "linear"]
        parts += [f"## {dataset} (target val_accuracy {targets[dataset]:g}; perfect scaling of "
                  f"linear up to global batch {perfect_scaling_end(linear)})",
                  table(lines, columns)]
    return "\n\n".join(parts)


def earlier(path: Path, cpu: str) -> list[dict[str, Any]]:
    """The runs already in ``path``; refused when measured on another CPU."""
    if not path.exists():
        return []
    data = json.loads(path.read_text())
    if data["cpu"] != cpu:
        raise SystemExit(f"{path} was measured on {data['cpu']!r}, this is {cpu!r}: run without "
                         "--append to start afresh")
    return list(data["runs"])


def parse_targets(text: str) -> dict[str, float]:
    """``digits=0.95,textures=0.7`` as a dict."""
    pairs = (item.split("=") for item in text.split(",") if item)
    return {name: float(value) for name, value in pairs}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--datasets", default=",".join(DATASETS))
    parser.add_argument("--arms", default=",".join(ARMS), help="comma-separated arm names")
    parser.add_argument("--seeds", default="", help="only these seeds (default: each arm's)")
    parser.add_argument("--batches", default="", help="only these global batches")
    parser.add_argument("--target", default="", help="dataset=accuracy,... (default: "
                        "pick_target, 2 points below the best mean final accuracy)")
    parser.add_argument("--append", action="store_true",
                        help="keep the runs in bench/results/statistical_scaling.json and skip "
                             "those of this plan already there")
    parser.add_argument("--report_only", action="store_true")
    parser.add_argument("--data", type=Path, default=Path("/tmp"))
    args = parser.parse_args()
    cpu = cpu_description()
    path = OUT / f"{NAME}.json"
    runs = earlier(path, cpu) if args.append or args.report_only else []
    result: dict[str, Any] = {"cpu": cpu, "model": MODEL, "per_worker_batch": PER_WORKER,
                              "runs": runs}
    todo = [] if args.report_only else plan(
        args.datasets.split(","), args.arms.split(","),
        [int(s) for s in args.seeds.split(",") if s] or None,
        [int(b) for b in args.batches.split(",") if b] or None)
    done = {key(r) for r in runs}
    data_dirs: dict[str, Path] = {}
    for dataset, arm, batch, seed in todo:
        if (dataset, arm, batch, seed) in done:
            continue
        if dataset not in data_dirs:
            data_dirs[dataset] = DATASETS[dataset].prepare(args.data / f"tfscale-{dataset}")
        manifest = json.loads((data_dirs[dataset] / "manifest.json").read_text())
        try:
            run = one_run(dataset, arm, batch, seed, data_dirs[dataset],
                          manifest["splits"]["train"]["examples"])
        except RuntimeError as error:
            print(f"{dataset} {arm} {batch} seed {seed} FAILED: {str(error)[-1500:]}", flush=True)
            continue
        runs.append(run)
        save(NAME, result)
        print(f"{dataset} | {arm} | batch {batch} | seed {seed}: final {run['final']:.4f}, "
              f"{run['steps']} steps, {run['wall_seconds']:.0f} s", flush=True)
    print(publish(result, parse_targets(args.target)))


def cpu_label(cpu: str) -> str:
    """:func:`bench.common.cpu_description` in a few words: the model and its widest vectors."""
    model, _, flags = cpu.partition(" (")
    return f"{model}, {'AVX-512' if 'avx512f' in flags else 'no AVX-512'}"


def publish(result: dict[str, Any], given: dict[str, float]) -> str:
    """Adds the targets (``given``, else :func:`pick_target`) and the rows to ``result`` and
    saves it, writes the efficiency files and the plots; returns the report."""
    runs, cpu = result["runs"], cpu_label(result["cpu"])
    by_dataset = {d: [r for r in runs if r["dataset"] == d] for d in DATASETS
                  if any(r["dataset"] == d for r in runs)}
    targets = {d: pick_target(rs) for d, rs in by_dataset.items()} | given
    result.update(targets=targets, rows={d: [summarize(g, targets[d]) for g in
                                             groups(rs).values()] for d, rs in by_dataset.items()})
    save(NAME, result)
    last = max((r["date"] for r in runs), default="")
    for dataset, mine in by_dataset.items():
        data = efficiency_file(dataset, mine, targets[dataset],
                               f"bench.{NAME} ({EFFICIENCY_ARM!r} arm), {last}, {cpu}")
        if data["points"]:
            write_json_atomic(EFFICIENCY / f"efficiency_{dataset}.json", data)
    if by_dataset:
        plot_accuracy(by_dataset, targets, cpu, DOCS / "accuracy.png")
        plot_steps(by_dataset, targets, cpu, DOCS / "steps.png")
    return report(result, targets)

if __name__ == "__main__":
    main()
