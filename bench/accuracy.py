"""Time to accuracy on real data: the same accuracy under every strategy.

Data: scikit-learn's 1,797 handwritten digits upscaled to 32x32 PNGs and converted with
``folder_to_tfrecord --validation_fraction 0.2`` (:mod:`bench.digits`): 1,438 training and 359
validation images. Model ``resnet50_tiny``, SGD with momentum 0.9, learning rate 0.05 per global
batch of 32 with one epoch of linear warmup and a cosine decay over 30 epochs, no preprocessing
flags (the defaults for 32-px images), exact evaluation of the whole validation split after
every epoch.

Runs, each in a fresh ``model_dir``:

- ``keras``: plain Keras ``model.fit`` of the same model on the same split
  (:mod:`bench.accuracy_keras`);
- ``default``, ``mirrored`` (2 CPU replicas), ``horovod``, ``multiworker`` and ``ddl`` (2 local
  workers each): the same global batch (32) and hyper-parameters;
- ``horovod x2 gradient lag``: ``horovod`` with ``--gradient_lag=1`` (each step applies the
  previous step's gradients);
- ``horovod x2 2x batch``: 2 workers at a global batch of 64 with ``--lr_scaling=linear`` and the
  warmup (Goyal et al.), to compare with ``default``;
- ``horovod x2 LARS 4x batch``: a global batch of 128 with LARS.

Every run is repeated for each ``--seeds`` value (weight initialisation and data order): with
359 validation images one image is 0.28 points, and single runs of the same configuration
differ by 2-3 points, so configurations are compared on their mean final accuracy. Prints a
table (mean and range of the final validation accuracy, epochs and seconds to the target,
training seconds) and the issue's checks, writes ``bench/results/accuracy.json`` (after every
run, so an interrupted benchmark keeps what it measured) and the plot
``docs/accuracy/accuracy.png`` (validation accuracy against wall-clock seconds and against
epochs, one line per run, mean over seeds).

    python -m bench.accuracy [--epochs 30] [--seeds 0,1] [--runs default,horovod x2] [--append]

About 40 minutes on 2 cores with two seeds. Needs scikit-learn (requirements-dev.txt) and
Horovod.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import ROOT, cpu_description, run_script, save, table, train
from bench.digits import prepare

PLOT = ROOT / "docs" / "accuracy" / "accuracy.png"
BASE_LR = 0.05
BATCH = 32  # global batch of the comparison
EPOCHS = 30
TRAIN_EXAMPLES = 1438
TWO = ["--num_processes=2", "--cpu_binding"]  # two local workers, one core each
# name -> (strategy flags, per-replica batch, extra flags)
RUNS: dict[str, tuple[list[str], int, list[str]]] = {
    "default": (["--strategy=default"], BATCH, []),
    "mirrored x2": (["--strategy=mirrored", "--cpu_replicas=2"], BATCH // 2, []),
    "horovod x2": (["--strategy=horovod", *TWO], BATCH // 2, []),
    "multiworker x2": (["--strategy=multiworker", *TWO], BATCH // 2, []),
    "ddl x2": (["--strategy=ddl", "--ddl_local_size=1", *TWO], BATCH // 2, []),
    "horovod x2 gradient lag": (["--strategy=horovod", *TWO, "--gradient_lag=1"], BATCH // 2,
                                []),
    "horovod x2 2x batch": (["--strategy=horovod", *TWO], BATCH, ["--lr_scaling=linear"]),
    "horovod x2 LARS 4x batch": (["--strategy=horovod", *TWO], 2 * BATCH,
                                 ["--optimizer=lars", "--lars_eta=0.01",
                                  f"--learning_rate={BASE_LR * 40}"]),
}


def lars_run(learning_rate: float) -> str:
    """Adds (and names) the LARS run at 4x the batch with another learning rate."""
    name = f"horovod x2 LARS 4x batch lr {learning_rate:g}"
    strategy, batch, extra = RUNS["horovod x2 LARS 4x batch"]
    RUNS[name] = (strategy, batch, [*extra[:-1], f"--learning_rate={learning_rate:g}"])
    return name
SAME_BATCH = ("keras", "default", "mirrored x2", "horovod x2", "multiworker x2", "ddl x2")


def tfscale_run(name: str, data_dir: Path, epochs: int, seed: int) -> dict[str, Any]:
    strategy, batch, extra = RUNS[name]
    replicas = 2 if "x2" in name else 1
    warmup = max(1, TRAIN_EXAMPLES // (batch * replicas))  # one epoch
    flags = [
        "--model=resnet50_tiny", "--dataset=imagenet", f"--data_dir={data_dir}",
        # Three channels, as the plain Keras run decodes the grey digits (the default would
        # now take the data's one).
        "--image_size=32", "--num_classes=10", "--input_channels=3", f"--epochs={epochs}",
        "--steps=0", f"--batch_size={batch}", f"--learning_rate={BASE_LR}", "--lr_schedule=cosine",
        f"--warmup_steps={warmup}", "--log_every=1000", f"--seed={seed}", *strategy, *extra,
    ]
    results = train(flags, timeout=3600)
    history = [{"epoch": e["epoch"], "seconds": e["seconds"],
                "val_accuracy": e["metrics"]["val_accuracy"]} for e in results["evaluations"]]
    return {"name": name, "seed": seed, "global_batch": results["global_batch_size"],
            "history": history, "train_seconds": results["train_seconds"],
            "examples": results["evaluations"][-1]["examples"], "flags": " ".join(flags)}


def keras_run(data_dir: Path, epochs: int, seed: int, num_classes: int = 10,
              warmup_steps: int | None = None) -> dict[str, Any]:
    """bench.accuracy_keras's run (warmup: one epoch, or ``warmup_steps``)."""
    warmup = [] if warmup_steps is None else ["--warmup_steps", str(warmup_steps)]
    out = run_script([sys.executable, "-m", "bench.accuracy_keras", "--data_dir", str(data_dir),
                      "--epochs", str(epochs), "--batch_size", str(BATCH),
                      "--learning_rate", str(BASE_LR), "--seed", str(seed),
                      "--num_classes", str(num_classes), *warmup], timeout=3600)
    history = [{k: e[k] for k in ("epoch", "seconds", "val_accuracy")} for e in out["epochs"]]
    return {"name": "keras", "seed": seed, "global_batch": BATCH, "history": history,
            "train_seconds": history[-1]["seconds"], "examples": out["validation_examples"],
            "flags": "plain model.fit"}


def first_at(history: list[dict[str, Any]], target: float) -> dict[str, Any] | None:
    """The first evaluation at or above ``target``."""
    return next((h for h in history if h["val_accuracy"] >= target), None)


def summarize(name: str, runs: list[dict[str, Any]], target: float) -> dict[str, Any]:
    """One row per run name over its seeds: mean (and range) of the final accuracy, mean epochs
    and seconds to the target over the seeds that reached it."""
    finals = [r["history"][-1]["val_accuracy"] for r in runs]
    reached = [h for h in (first_at(r["history"], target) for r in runs) if h]
    return {
        "run": name, "global batch": runs[0]["global_batch"], "seeds": len(runs),
        "final val acc (mean)": mean(finals),
        "min-max": f"{min(finals):.3f}-{max(finals):.3f}",
        "reached target": f"{len(reached)}/{len(runs)}",
        "epochs to target": mean([h["epoch"] for h in reached]) if reached else "-",
        "s to target": mean([h["seconds"] for h in reached]) if reached else "-",
        "train s": mean([r["train_seconds"] for r in runs]),
    }


def mean(values: list[float]) -> float:
    return float(sum(values) / len(values))


def verdicts(rows: dict[str, dict[str, Any]], target: float) -> list[str]:
    """The issue's checks, on the mean final accuracies."""
    acc = {name: row["final val acc (mean)"] for name, row in rows.items()}
    same = [n for n in acc if n in SAME_BATCH]
    lines = []
    if same:
        spread = max(acc[n] for n in same) - min(acc[n] for n in same)
        floor = f"{target} or within 1 point of keras" if "keras" in acc else f"{target}"
        lines.append(f"same global batch ({', '.join(same)}): spread of mean final accuracy "
                     f"{100 * spread:.2f} points (target <= 1); lowest "
                     f"{min(acc[n] for n in same):.3f} (target >= {floor})")
    if "default" in acc and "horovod x2 2x batch" in acc:
        gap = acc["default"] - acc["horovod x2 2x batch"]
        lines.append(f"2 workers at 2x the batch with linear scaling: {100 * gap:+.2f} points "
                     "below default (target <= 1)")
    return lines


def plot(runs: list[dict[str, Any]], target: float, path: Path, cpu: str) -> None:
    """Writes :func:`figure` to the PNG file ``path``."""
    import matplotlib.pyplot as plt

    fig = figure(runs, target, cpu)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def figure(runs: list[dict[str, Any]], target: float, cpu: str) -> Any:
    """Validation accuracy against seconds and epochs, one line per run name (mean of its
    seeds at each epoch). Each run has its own colour, marker and marker phase, so that lines
    on top of each other stay visible; epochs are whole numbers; the legend sits below the
    axes; the title names the model, data and CPU."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    names = list(dict.fromkeys(r["name"] for r in runs))
    legend_rows = -(-len(names) // 3)
    height = 5.0 + 0.17 * legend_rows  # inches: the axes, and the legend's rows below them
    fig, axes = plt.subplots(1, 2, figsize=(12, height), sharey=True)
    colors = [plt.get_cmap("tab20")(i) for i in range(20)]  # one colour per run, past ten too
    markers = "osD^vP*Xph<>"
    for number, name in enumerate(names):
        mine = [r["history"] for r in runs if r["name"] == name]
        epochs = min(len(h) for h in mine)
        curve = {key: [mean([h[i][key] for h in mine]) for i in range(epochs)]
                 for key in ("seconds", "epoch", "val_accuracy")}
        style = "--" if name == "keras" else ":" if "LARS" in name else "-"
        batch = next(r["global_batch"] for r in runs if r["name"] == name)
        for ax, key in zip(axes, ("seconds", "epoch"), strict=True):
            ax.plot(curve[key], curve["val_accuracy"], style, color=colors[number % len(colors)],
                    marker=markers[number % len(markers)], markersize=4, markerfacecolor="none",
                    markevery=(number % 4, 4), label=f"{name} (batch {batch})")
    for ax, label in zip(axes, ("wall-clock seconds of training", "epoch"), strict=True):
        ax.axhline(target, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[1].xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("validation accuracy (whole split, mean over seeds)")
    axes[0].set_ylim(0, 1.01)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=8, loc="lower center", ncol=3, frameon=False)
    fig.suptitle(f"resnet50_tiny on scikit-learn digits (32x32 PNGs): validation accuracy per "
                 f"strategy, mean over seeds\nCPU: {cpu.split(' (')[0]}, dotted line: "
                 f"target {target:g}", fontsize=11)
    fig.tight_layout(rect=(0, (0.17 * legend_rows + 0.1) / height, 1, 1))
    return fig


def report(result: dict[str, Any]) -> str:
    columns = ["run", "global batch", "seeds", "final val acc (mean)", "min-max",
               "reached target", "epochs to target", "s to target", "train s"]
    checks = "\n".join(f"- {line}" for line in result["verdicts"])
    return (f"CPU: {result['cpu']}; {result['epochs']} epochs; seeds {result['seeds']}; target "
            f"val_accuracy {result['target']}\n\n{table(result['rows'], columns)}\n\n{checks}")


def previous_runs(epochs: int) -> list[dict[str, Any]]:
    """The runs of an earlier ``bench.accuracy`` to extend; refused when they were measured on
    another CPU or for another number of epochs (their figures would not compare)."""
    path = ROOT / "bench" / "results" / "accuracy.json"
    if not path.exists():
        return []
    earlier = json.loads(path.read_text())
    if earlier["cpu"] != cpu_description() or earlier["epochs"] != epochs:
        raise SystemExit(f"--append: {path} was measured with {earlier['epochs']} epochs on "
                         f"{earlier['cpu']!r}; this run is {epochs} epochs on "
                         f"{cpu_description()!r}. Run without --append to start afresh.")
    return list(earlier["runs"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--seeds", default="0,1", help="comma-separated seeds of every run")
    parser.add_argument("--runs", default=",".join(["keras", *RUNS]),
                        help="comma-separated run names")
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "tfscale-digits")
    parser.add_argument("--lars_lr", default="",
                        help="comma-separated learning rates of extra LARS 4x-batch runs")
    parser.add_argument("--append", action="store_true",
                        help="keep the runs already in bench/results/accuracy.json (measured on "
                             "the same CPU) and add these seeds to them")
    args = parser.parse_args()
    data_dir = prepare(args.data)
    seeds = [int(s) for s in args.seeds.split(",")]
    extra = [lars_run(float(lr)) for lr in args.lars_lr.split(",") if lr]
    runs: list[dict[str, Any]] = previous_runs(args.epochs) if args.append else []
    result: dict[str, Any] = {
        "cpu": cpu_description(), "epochs": args.epochs, "target": args.target,
        "seeds": sorted({*seeds, *(r["seed"] for r in runs)}), "runs": runs}
    # Seeds outermost, so an interrupted run still has every configuration at least once.
    for seed in seeds:
        for name in [*(n for n in args.runs.split(",") if n), *extra]:
            run = (keras_run(data_dir, args.epochs, seed) if name == "keras"
                   else tfscale_run(name, data_dir, args.epochs, seed))
            runs.append(run)
            print(f"{name} seed {seed}: final {run['history'][-1]['val_accuracy']:.4f} over "
                  f"{run['examples']} examples, {run['train_seconds']:.0f} s", flush=True)
            save("accuracy", result)
    names = list(dict.fromkeys(r["name"] for r in runs))
    by_name = {n: summarize(n, [r for r in runs if r["name"] == n], args.target) for n in names}
    result.update(rows=list(by_name.values()), verdicts=verdicts(by_name, args.target))
    save("accuracy", result)
    plot(runs, args.target, PLOT, result["cpu"])
    print(report(result))


if __name__ == "__main__":
    main()
