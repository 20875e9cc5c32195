"""What ``--augment=auto`` should do on small images: time to accuracy of each candidate policy
on two small real image datasets, against a plain Keras fit at the same epochs.

Datasets (no download): scikit-learn's digits (:mod:`bench.digits`, 10 classes, 1,438 training
and 359 validation images, strokes that fill the frame) and scikit-image's texture tiles
(:mod:`bench.textures`, 3 classes, 615 and 153, no frame at all). Both at 32x32 px.

The run is the newcomer's short first run of issue 28: ``resnet50_tiny``, 10 epochs, SGD with
momentum 0.9 at 0.05 per global batch of 32, cosine decay, 20 warmup steps, no preprocessing
flags but ``--augment``. Candidates (``--augment`` values):

- ``none``: the whole image, as the plain Keras fit sees it;
- ``small``: pad by 1/8 of the side and take a random crop, for the whole run, without flips
  (what ``auto`` gave 32-px images before);
- ``auto``: what this release's ``auto`` resolves to on 32-px images (``none``).

Two more candidates need a patch of the pipeline, kept in
``bench/patches/augment_candidates.diff`` (``git apply`` it, then add ``small16,ramp,ramp2`` to
``--augments``): ``small16`` pads by 1/16 of the side; ``ramp`` and ``ramp2`` scale each shift by
the share of the run done so far (over the whole run, or its first half), so that augmentation
ramps in.

Each is run under ``default`` (1 process) and ``horovod x2`` (2 workers of 16, the same global
batch; ``horovod x2 sync_bn`` adds ``--sync_bn``), for every seed. Prints mean final validation
accuracy, how many seeds reached the target, and the mean epochs and seconds to it; writes
``bench/results/augment_policy.json`` after every run.

    python -m bench.augment_policy [--seeds 0,1,2] [--augments none,small,auto]
        [--strategies default,horovod x2] [--append]

About 35 s a run on 2 cores (10 epochs): 3 seeds x 2 datasets x (1 + 3 policies x 2
strategies) runs take about 25 minutes. Needs scikit-learn and scikit-image
(requirements-dev.txt, requirements-bench.txt) and Horovod.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from bench import digits, textures
from bench.accuracy import BASE_LR, BATCH, keras_run, summarize
from bench.common import ROOT, cpu_description, save, table, train

EPOCHS = 10
WARMUP_STEPS = 20
DATASETS = {"digits": (digits, 10), "textures": (textures, 3)}
# Validation accuracy to reach: what plain Keras gets to in 10 epochs (textures: 3 classes of 32-px
# tiles, harder than they look; the plain fit ends at 0.48-0.78 over seeds).
TARGETS = {"digits": 0.95, "textures": 0.75}
TWO = ["--strategy=horovod", "--num_processes=2", "--cpu_binding"]
STRATEGIES = {"default": ([], BATCH), "horovod x2": (TWO, BATCH // 2),
              "horovod x2 sync_bn": ([*TWO, "--sync_bn"], BATCH // 2)}


def tfscale_run(data_dir: Path, classes: int, strategy: str, augment: str, epochs: int,
                seed: int) -> dict[str, Any]:
    flags, batch = STRATEGIES[strategy]
    results = train([
        "--model=resnet50_tiny", "--dataset=imagenet", f"--data_dir={data_dir}",
        # Three channels, as the recorded runs decoded the grey images (the default would now
        # take the data's one).
        "--image_size=32", f"--num_classes={classes}", "--input_channels=3", f"--epochs={epochs}",
        "--steps=0",
        f"--batch_size={batch}", f"--learning_rate={BASE_LR}", "--lr_schedule=cosine",
        f"--warmup_steps={WARMUP_STEPS}", "--log_every=1000", f"--seed={seed}",
        f"--augment={augment}", *(["--horizontal_flip=off"] if augment == "small" else []),
        *flags], timeout=3600)
    history = [{"epoch": e["epoch"], "seconds": e["seconds"],
                "val_accuracy": e["metrics"]["val_accuracy"]} for e in results["evaluations"]]
    return {"seed": seed, "global_batch": results["global_batch_size"], "history": history,
            "train_seconds": results["train_seconds"],
            "examples": results["evaluations"][-1]["examples"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--target", type=float, default=None,
                        help="validation accuracy to reach (default: per dataset, TARGETS)")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--datasets", default="digits,textures")
    parser.add_argument("--augments", default="none,small,auto")
    parser.add_argument("--strategies", default="default,horovod x2",
                        help=f"comma-separated, of: {', '.join(STRATEGIES)}")
    parser.add_argument("--keras", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--append", action="store_true",
                        help="keep the runs already in bench/results/augment_policy.json")
    parser.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "tfscale-data")
    args = parser.parse_args()
    strategies = args.strategies.split(",")
    earlier = ROOT / "bench" / "results" / "augment_policy.json"
    runs: list[dict[str, Any]] = (
        json.loads(earlier.read_text())["runs"] if args.append and earlier.exists() else [])
    targets = {name: args.target or TARGETS[name] for name in DATASETS}
    result: dict[str, Any] = {"cpu": cpu_description(), "epochs": args.epochs,
                              "targets": targets, "runs": runs}
    for seed in (int(s) for s in args.seeds.split(",")):
        for dataset in args.datasets.split(","):
            module, classes = DATASETS[dataset]
            data_dir = module.prepare(args.out / dataset)
            names = [("keras", "none")] if args.keras else []
            names += [(s, a) for a in args.augments.split(",") for s in strategies]
            for strategy, augment in names:
                run = (keras_run(data_dir, args.epochs, seed, classes, WARMUP_STEPS)
                       if strategy == "keras" else
                       tfscale_run(data_dir, classes, strategy, augment, args.epochs, seed))
                name = "keras" if strategy == "keras" else f"{strategy} --augment={augment}"
                run.update(dataset=dataset, name=name)
                runs.append(run)
                print(f"{dataset} {name} seed {seed}: final "
                      f"{run['history'][-1]['val_accuracy']:.4f}, "
                      f"{run['train_seconds']:.0f} s", flush=True)
                save("augment_policy", result)
    result["rows"] = rows_of(runs, targets)
    save("augment_policy", result)
    print(report(result))


def rows_of(runs: list[dict[str, Any]], targets: dict[str, float]) -> list[dict[str, Any]]:
    """One row per dataset and run name, over its seeds (:func:`bench.accuracy.summarize`)."""
    rows = []
    for dataset in dict.fromkeys(r["dataset"] for r in runs):
        mine = [r for r in runs if r["dataset"] == dataset]
        for name in dict.fromkeys(r["name"] for r in mine):
            row = summarize(name, [r for r in mine if r["name"] == name], targets[dataset])
            rows.append({"dataset": dataset, "target": targets[dataset], **row})
    return rows


def report(result: dict[str, Any]) -> str:
    columns = ["dataset", "run", "seeds", "final val acc (mean)", "min-max", "target",
               "reached target", "epochs to target", "s to target", "train s"]
    return (f"CPU: {result['cpu']}; {result['epochs']} epochs\n\n"
            f"{table(result['rows'], columns)}")


if __name__ == "__main__":
    main()
