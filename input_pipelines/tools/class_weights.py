"""Compute per-class loss weights from a segmentation pipeline's training labels.

``--class_weights`` is either comma-separated numbers (``0.1,1,5``) or the path of a JSON file:
a list of numbers, or an object whose ``class_weights`` is one (what this module's tool writes).
The tool scans the labels of a training pipeline once, counts the pixels of each class and
writes weights from the class frequencies ``f``:

- ``inverse``: ``1 / f``
- ``inverse_sqrt``: ``1 / sqrt(f)``
- ``deepcam``: ``f ** -0.125`` (the MLPerf HPC DeepCAM reference's weighting)

normalized so that the frequency-weighted mean weight ``sum(f * w)`` is 1: the weighted loss of
a typical batch stays on the scale of the unweighted loss, so learning rates carry over. A class
absent from the scanned labels gets the largest weight of the present ones. Example::

    python -m input_pipelines.tools.class_weights --dataset synthetic_seg --image_size 64 \\
        --input_channels 16 --num_classes 3 --samples 512 --method deepcam --out weights.json
    python -m tfscale.train --model deeplabv3plus_tiny --dataset synthetic_seg ... \\
        --class_weights weights.json
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence

import numpy as np

from input_pipelines.registry import PIPELINES, Shard
from tfscale.config.train_config import TrainConfig
from tfscale.training.class_weights import METHODS, weights_from_counts


def count_labels(config: TrainConfig, samples: int, batch_size: int = 8) -> tuple[list[int], int]:
    """Pixels per class in the labels of ``config.dataset``'s training split (worker 0).

    Args:
        config: supplies the dataset, its shapes, ``num_classes`` and ``seed``.
        samples: samples to scan; 0 means one pass over a finite dataset.
        batch_size: samples per batch while scanning.

    Returns:
        The counts and the number of samples scanned.

    Raises:
        ValueError: ``samples`` is 0 for an endless dataset, or a label is out of range.
    """
    batches = PIPELINES.get(config.dataset)(config, Shard(), "train", batch_size)
    if not samples:
        if batches.examples is None:
            raise ValueError(f"--dataset={config.dataset} is endless; give --samples")
        samples = batches.examples
    steps = max(1, math.ceil(samples / batch_size))
    counts = np.zeros(config.num_classes, np.int64)
    for _, labels in batches.dataset.take(steps).as_numpy_iterator():
        low, high = int(labels.min()), int(labels.max())
        if low < 0 or high >= config.num_classes:
            raise ValueError(
                f"--dataset={config.dataset} has label {low if low < 0 else high}, "
                f"outside [0, {config.num_classes}) for --num_classes"
            )
        counts += np.bincount(labels.ravel(), minlength=config.num_classes)
    return [int(c) for c in counts], steps * batch_size


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m input_pipelines.tools.class_weights", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--dataset", required=True, help="Registered segmentation pipeline.")
    parser.add_argument("--data_dir", default="", help="Its data, for file-based pipelines.")
    parser.add_argument("--image_size", type=int, default=64)
    parser.add_argument("--input_channels", type=int, default=16)
    parser.add_argument("--num_classes", type=int, required=True)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--samples",
        type=int,
        default=0,
        help="Samples to scan (0 = one pass over a finite dataset).",
    )
    parser.add_argument("--method", choices=METHODS, default="deepcam")
    parser.add_argument("--out", required=True, help="JSON file to write.")
    args = parser.parse_args(argv)
    try:
        config = TrainConfig(
            dataset=args.dataset,
            data_dir=args.data_dir,
            image_size=args.image_size,
            input_channels=args.input_channels,
            num_classes=args.num_classes,
            seed=args.seed,
        )
        counts, scanned = count_labels(config, args.samples)
        weights = weights_from_counts(counts, args.method)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    total = sum(counts)
    document = {
        "class_weights": weights,
        "method": args.method,
        "normalization": "sum over classes of frequency x weight = 1",
        "frequencies": [c / total for c in counts],
        "pixels": counts,
        "samples": scanned,
        "dataset": args.dataset,
        "data_dir": args.data_dir,
        "absent_classes": [c for c, n in enumerate(counts) if n == 0],
    }
    with open(args.out, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=2)
    print(
        f"wrote {args.out}: {args.method} weights {np.round(weights, 4).tolist()} from "
        f"{scanned} samples (class frequencies {np.round(document['frequencies'], 5).tolist()})"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
