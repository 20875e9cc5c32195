"""Time to accuracy on real data: the same accuracy under every strategy.

Data: scikit-learn's 1,797 handwritten digits upscaled to 32x32 PNGs and converted with
``folder_to_tfrecord --validation_fraction 0.2`` (:mod:`bench.digits`): 1,438 training and 359
validation images. Model ``resnet50_tiny``, SGD with momentum 0.9, learning rate 0.05 per global
batch of 32 with one epoch of linear warmup and a cosine decay, no preprocessing flags (the
defaults for 32-px images), exact evaluation of the whole validation split after every epoch.

Runs, each in a fresh ``model_dir``:

- ``keras``: plain Keras ``model.fit`` of the same model on the same split
  (:mod:`bench.accuracy_keras`);
- ``default``, ``mirrored`` (2 CPU replicas), ``horovod``, ``multiworker`` and ``ddl`` (2 local
  workers each): the same global batch (32) and hyper-parameters;
- ``horovod x2, 2x batch``: 2 workers at a global batch of 64 with ``--lr_scaling=linear`` and the
  warmup (Goyal et al.), to compare with ``default``;
- ``horovod x2, LARS 4x batch``: a global batch of 128 with LARS.

Prints a table (final and best validation accuracy, time to the target, wall-clock), writes
``bench/results/accuracy.json`` and the plot ``docs/accuracy/accuracy.png`` (validation accuracy
against wall-clock seconds and against epochs, one line per run).

    python -m bench.accuracy [--epochs 20] [--runs default,horovod] [--target 0.95]

About 15 minutes on 2 cores. Needs scikit-learn (requirements-dev.txt) and Horovod.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.common import ROOT, run_script, save, table, train
from bench.digits import prepare
from tfscale.precision import cpu_info

PLOT = ROOT / "docs" / "accuracy" / "accuracy.png"
BASE_LR = 0.05
BATCH = 32  # global batch of the comparison
# name -> (strategy flags, per-replica batch, extra flags)
RUNS: dict[str, tuple[list[str], int, list[str]]] = {
    "default": (["--strategy=default"], BATCH, []),
    "mirrored x2": (["--strategy=mirrored", "--cpu_replicas=2"], BATCH // 2, []),
    "horovod x2": (["--strategy=horovod", "--num_processes=2"], BATCH // 2, []),
    "multiworker x2": (["--strategy=multiworker", "--num_processes=2"], BATCH // 2, []),
    "ddl x2": (["--strategy=ddl", "--num_processes=2", "--ddl_local_size=1"], BATCH // 2, []),
    "horovod x2, 2x batch": (["--strategy=horovod", "--num_processes=2"], BATCH,
                             ["--lr_scaling=linear"]),
    "horovod x2, LARS 4x batch": (["--strategy=horovod", "--num_processes=2"], 2 * BATCH,
                                  ["--optimizer=lars", "--lars_eta=0.01",
                                   f"--learning_rate={BASE_LR * 40}"]),
}


def cpu_description() -> str:
    """The CPU model and its vector/bf16 instruction-set flags (figures depend on them)."""
    model, flags = cpu_info()
    wide = " ".join(sorted(f for f in flags if f.startswith(("avx", "amx", "fma"))))
    return f"{model} ({wide})" if wide else model


def tfscale_run(name: str, data_dir: Path, epochs: int) -> dict[str, Any]:
    strategy, batch, extra = RUNS[name]
    replicas = 2 if "x2" in name else 1
    examples_per_step = batch * replicas
    warmup = max(1, 1438 // examples_per_step)  # one epoch
    flags = [
        "--model=resnet50_tiny", "--dataset=imagenet", f"--data_dir={data_dir}",
        "--image_size=32", "--num_classes=10", f"--epochs={epochs}", "--steps=0",
        f"--batch_size={batch}", f"--learning_rate={BASE_LR}", "--lr_schedule=cosine",
        f"--warmup_steps={warmup}", "--log_every=1000", *strategy, *extra,
    ]
    results = train(flags, timeout=3600)
    history = [{"epoch": e["epoch"], "seconds": e["seconds"],
                "val_accuracy": e["metrics"]["val_accuracy"]} for e in results["evaluations"]]
    return {"name": name, "global_batch": results["global_batch_size"], "history": history,
            "train_seconds": results.get("train_seconds"), "flags": " ".join(flags)}


def keras_run(data_dir: Path, epochs: int) -> dict[str, Any]:
    out = run_script([sys.executable, "-m", "bench.accuracy_keras", "--data_dir", str(data_dir),
                      "--epochs", str(epochs), "--batch_size", str(BATCH),
                      "--learning_rate", str(BASE_LR)], timeout=3600)
    history = [{k: e[k] for k in ("epoch", "seconds", "val_accuracy")} for e in out["epochs"]]
    return {"name": "keras", "global_batch": BATCH, "history": history,
            "train_seconds": history[-1]["seconds"], "flags": "plain model.fit"}


def summarize(run: dict[str, Any], target: float) -> dict[str, Any]:
    """Final and best accuracy, and the first evaluation at or above ``target``."""
    history = run["history"]
    reached = next((h for h in history if h["val_accuracy"] >= target), None)
    return {
        "run": run["name"], "global batch": run["global_batch"],
        "final val acc": history[-1]["val_accuracy"],
        "best val acc": max(h["val_accuracy"] for h in history),
        "epochs to target": reached["epoch"] if reached else "not reached",
        "s to target": round(reached["seconds"], 1) if reached else "not reached",
        "train s": round(run["train_seconds"] or history[-1]["seconds"], 1),
    }


def plot(runs: list[dict[str, Any]], target: float, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for run in runs:
        h = run["history"]
        style = "--" if run["name"] == "keras" else "-"
        for ax, key in zip(axes, ("seconds", "epoch"), strict=True):
            ax.plot([e[key] for e in h], [e["val_accuracy"] for e in h], style, marker=".",
                    label=f"{run['name']} (batch {run['global_batch']})")
    for ax, label in zip(axes, ("wall-clock seconds of training", "epoch"), strict=True):
        ax.axhline(target, color="grey", linewidth=0.8, linestyle=":")
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel("validation accuracy (whole split)")
    axes[0].set_ylim(0, 1.01)
    axes[1].legend(fontsize=8, loc="lower right")
    fig.suptitle("resnet50_tiny on 32x32 digits: validation accuracy per strategy")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def report(result: dict[str, Any]) -> str:
    columns = ["run", "global batch", "final val acc", "best val acc", "epochs to target",
               "s to target", "train s"]
    return (f"CPU: {result['cpu']}; {result['epochs']} epochs; target val_accuracy "
            f"{result['target']}\n\n{table(result['rows'], columns)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--target", type=float, default=0.95)
    parser.add_argument("--runs", default=",".join(["keras", *RUNS]),
                        help="comma-separated run names")
    parser.add_argument("--data", type=Path, default=Path(tempfile.gettempdir()) / "tfscale-digits")
    args = parser.parse_args()
    data_dir = prepare(args.data)
    runs = []
    for name in args.runs.split(","):
        run = keras_run(data_dir, args.epochs) if name == "keras" else tfscale_run(
            name, data_dir, args.epochs)
        runs.append(run)
        print(summarize(run, args.target), flush=True)
    result = {"cpu": cpu_description(), "epochs": args.epochs, "target": args.target,
              "runs": runs, "rows": [summarize(r, args.target) for r in runs]}
    save("accuracy", result)
    plot(runs, args.target, PLOT)
    print(report(result))


if __name__ == "__main__":
    main()
