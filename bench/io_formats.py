"""TFRecord against LMDB against class folders on the same images, measured by io_check.

Two image sets, each stored three ways with the files' bytes kept as they are
(``folder_to_tfrecord --encoding keep``, 8 shards; ``folder_to_lmdb --encoding keep``; the
folder itself):

- ``jpeg224``: ``--jpegs`` ImageNet-like 224x224 JPEGs (``bench.input_pipeline.picture``),
  8 classes, trained at 224 px, batch 32; model ResNet-50;
- ``digits32``: scikit-learn's 1,797 digits as 32x32 PNGs (``bench.digits``), trained at
  32 px, batch 64; model ``resnet50_tiny``.

Each round runs ``python -m input_pipelines.tools.io_check`` on every (images, format, workers
in 1 and 2) in alternating order (:func:`bench.common.in_round_order`: the machine is shared),
each in a fresh process, so cold reads start from a dropped page cache. The model rates are
measured once (short synthetic runs) and given to every run. Reports each figure's median over
the rounds and writes ``bench/results/io_formats.json`` after every run.

    python -m bench.io_formats [--rounds 3 --seconds 2 --jpegs 300 --work_dir /tmp/io_formats]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.common import ROOT, cpu_description, in_round_order, save, table

FORMATS = {"folder": "image_folder", "tfrecord": "imagenet", "lmdb": "lmdb"}
IMAGES = {  # name: (image_size, batch_size, num_classes, model)
    "jpeg224": (224, 32, 8, "resnet50"),
    "digits32": (32, 64, 10, "resnet50_tiny"),
}
FIGURES = (("storage", "cold_mb_s"), ("storage", "warm_mb_s"), ("pipeline", "records_cold"),
           ("pipeline", "records"), ("pipeline", "decoded"), ("pipeline", "augmented"))


def write_jpegs(folder: Path, count: int) -> None:
    """``count`` 224x224 JPEGs under ``folder/train/classK`` (kept when already there)."""
    import tensorflow as tf

    from bench.input_pipeline import CLASSES, picture

    if (folder / "done").exists():
        return
    import numpy as np

    rng = np.random.default_rng(0)
    for i in range(count):
        path = folder / "train" / f"class{i % CLASSES}" / f"{i:05d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(tf.io.encode_jpeg(picture(rng, 224, 224), quality=90).numpy())
    (folder / "done").write_text("")


def prepare(work: Path, jpegs: int) -> dict[str, dict[str, Path]]:
    """Both image sets as folder, TFRecord and LMDB; returns their data_dirs."""
    from bench.digits import write_folder
    from input_pipelines.tools import folder_to_lmdb, folder_to_tfrecord

    write_jpegs(work / "jpeg224" / "folder", jpegs)
    folders = {"jpeg224": work / "jpeg224" / "folder",
               "digits32": write_folder(work / "digits32", 32)}
    dirs: dict[str, dict[str, Path]] = {}
    for name, folder in folders.items():
        base = folder.parent
        folder_to_tfrecord.convert(str(folder), str(base / "tfrecord"), shards=8,
                                   validation_shards=1, encoding="keep")
        folder_to_lmdb.convert(str(folder), str(base / "lmdb"), encoding="keep")
        dirs[name] = {"folder": folder, "tfrecord": base / "tfrecord", "lmdb": base / "lmdb"}
    return dirs


def model_rates(args: argparse.Namespace) -> dict[str, float]:
    """Each image set's model images/s (one process), measured unless given."""
    from input_pipelines.tools.io_check import model_rate
    from tfscale.config.train_config import TrainConfig

    given = {"jpeg224": args.resnet_images_per_sec, "digits32": args.tiny_images_per_sec}
    rates = {}
    for name, (size, batch, classes, model) in IMAGES.items():
        rates[name] = given[name] or model_rate(TrainConfig(
            model=model, image_size=size, batch_size=batch, num_classes=classes,
            model_dir=tempfile.gettempdir()), args.model_steps)
    return rates


def run_io_check(data_dir: Path, images: str, fmt: str, workers: int, seconds: float,
                 model: float) -> dict[str, Any]:
    size, batch, classes, _ = IMAGES[images]
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "io_check.json"
        command = [sys.executable, "-m", "input_pipelines.tools.io_check",
                   f"--dataset={FORMATS[fmt]}", f"--data_dir={data_dir}",
                   f"--image_size={size}", f"--batch_size={batch}", f"--num_classes={classes}",
                   f"--workers={workers}", f"--seconds={seconds}",
                   f"--model_images_per_sec={model}", f"--json={out}"]
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stderr[-2000:]}")
        result: dict[str, Any] = json.loads(out.read_text())
        return result


def summary(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (images, format, workers): each figure's median over the rounds."""
    rows = []
    keys = sorted({(r["images"], r["format"], r["workers"]) for r in runs},
                  key=lambda k: (list(IMAGES).index(k[0]), k[2], list(FORMATS).index(k[1])))
    for images, fmt, workers in keys:
        mine = [r for r in runs if (r["images"], r["format"], r["workers"]) == (images, fmt,
                                                                                 workers)]
        row: dict[str, Any] = {"images": images, "format": fmt, "workers": workers,
                               "rounds": len(mine),
                               "kB_per_image": mine[0]["bytes_per_image"] / 1e3}
        for part, key in FIGURES:
            row[key] = statistics.median(r[part][key] for r in mine)
        cached = [r["pipeline"]["records_cold_still_cached"] for r in mine]
        row["records_cold_cached"] = max((c for c in cached if c is not None), default=None)
        row["limits"] = "/".join(sorted({r["limit"] for r in mine}))
        rows.append(row)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seconds", type=float, default=2.0,
                        help="io_check --seconds: timing of each warm stage")
    parser.add_argument("--jpegs", type=int, default=300)
    parser.add_argument("--model_steps", type=int, default=4)
    parser.add_argument("--resnet_images_per_sec", type=float, default=0.0,
                        help="Skip measuring ResNet-50 at 224 px, batch 32, and use this.")
    parser.add_argument("--tiny_images_per_sec", type=float, default=0.0,
                        help="Skip measuring resnet50_tiny at 32 px, batch 64, and use this.")
    parser.add_argument("--work_dir", default=os.path.join(tempfile.gettempdir(), "io_formats"))
    args = parser.parse_args()
    start = time.perf_counter()
    dirs = prepare(Path(args.work_dir), args.jpegs)
    models = model_rates(args)
    cases = [(images, fmt, workers) for images in IMAGES for workers in (1, 2)
             for fmt in FORMATS]
    runs: list[dict[str, Any]] = []
    result: dict[str, Any] = {"cpu": cpu_description(), "cpus": os.cpu_count(),
                              "models_images_per_sec": models, "seconds": args.seconds}
    for round_ in range(args.rounds):
        for images, fmt, workers in in_round_order(cases, round_):
            load = os.getloadavg()[0]
            found = run_io_check(dirs[images][fmt], images, fmt, workers, args.seconds,
                                 models[images])
            runs.append({**found, "images": images, "format": fmt, "round": round_,
                         "load_average_1min": round(load, 2)})
            print(f"round {round_} {images} {fmt} x{workers}: augmented "
                  f"{found['pipeline']['augmented']:.0f} images/s, limit {found['limit']} "
                  f"(load {load:.1f})", flush=True)
            result.update(runs=runs, rows=summary(runs),
                          minutes=round((time.perf_counter() - start) / 60, 1))
            save("io_formats", result)
    columns = ["images", "format", "workers", "rounds", "kB_per_image",
               *(key for _, key in FIGURES), "records_cold_cached", "limits"]
    print(f"{result['cpu']}, {result['cpus']} CPUs; model images/s per worker: {models}")
    print(table(result["rows"], columns))


if __name__ == "__main__":
    main()
