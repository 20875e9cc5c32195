"""Convert HDF5/NumPy segmentation samples to TFRecord shards, with stats.json.

    python -m input_pipelines.tools.segmentation_to_tfrecord --input_dir /data/climate \\
        --output_dir /data/climate-tfrecord --shards 64 [--validation_shards 8] \\
        [--data_key data --label_key labels]

Reads the ``.h5``/``.hdf5``/``.npz`` files of each split (``INPUT_DIR/train/``,
``INPUT_DIR/validation/``, ``INPUT_DIR/SPLIT-*``, or all of ``INPUT_DIR`` as training data), one
or many samples per file (:mod:`input_pipelines.core.sample_files`),
checks that every sample has the
first one's shape, and writes balanced shards (schema in
:mod:`input_pipelines.core.segmentation_records`), ``manifest.json``, and ``stats.json`` with the
per-channel normalization of the training samples, for ``--dataset=segmentation_tfrecord``.
Re-running resumes: finished shards whose inputs are unchanged are verified and skipped (their
statistics are kept in the manifest, so stats.json stays complete). Samples are read and
encoded on ``--workers`` processes (default: every core), with a progress line of samples,
samples/s and the time left; the output is the same for any number of workers.
"""

from __future__ import annotations

import functools
import os
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from input_pipelines.core.encode_pool import EncodePool
from input_pipelines.core.errors import DataError
from input_pipelines.core.files import split_files
from input_pipelines.core.report import Progress
from input_pipelines.core.sample_files import (
    DATA_KEY,
    H5_SUFFIXES,
    LABEL_KEY,
    NUMPY_SUFFIXES,
    Layout,
    check_same_shapes,
    inspect,
    read_sample,
)
from input_pipelines.core.shard_writer import (
    converter_parser,
    load_manifest,
    run_converter,
    write_split,
)
from input_pipelines.core.stats import (
    STATS,
    ChannelStats,
    add_counts,
    class_pixels,
    stats_document,
)
from tfscale.config.tasks import SEGMENTATION
from tfscale.training.files import write_json_atomic

Sample = tuple[str, int]  # (file, index in the file)


class ShardStats:
    """Channel statistics and class pixel counts of one shard."""

    def __init__(self) -> None:
        self.channels: ChannelStats | None = None
        self.classes: list[int] = []

    def add(self, data: np.ndarray, labels: np.ndarray) -> None:
        if self.channels is None:
            self.channels = ChannelStats(data.shape[-1])
        self.channels.add(data)
        self.classes = class_pixels(labels, self.classes)

    def to_dict(self) -> dict[str, Any]:
        channels = self.channels.to_dict() if self.channels else {}
        return {**channels, "class_pixels": self.classes}

    def merge(self, saved: dict[str, Any]) -> None:
        """Adds statistics saved by :meth:`to_dict` (e.g. one sample's)."""
        if "pixels" in saved:
            if self.channels is None:
                self.channels = ChannelStats(len(saved["mean"]))
            self.channels.merge(saved["pixels"], np.array(saved["mean"]), np.array(saved["m2"]))
        self.classes = add_counts(self.classes, saved["class_pixels"])


def encode_sample(sample: Sample, stats: ShardStats, layouts: dict[str, Layout],
                  keys: tuple[str, str]) -> tuple[bytes, int, int]:
    """An :data:`~input_pipelines.core.encode_pool.Encode` of samples: the record of sample
    ``sample`` (file, index) and its label range, its data and labels added to ``stats``.

    Raises:
        DataError: its data holds NaN or Inf.
    """
    data, labels = read_sample(sample[0], sample[1], layouts[sample[0]], *keys)
    if not np.isfinite(data).all():
        raise DataError(f"{sample[0]}: sample {sample[1]}: data values are NaN or Inf")
    stats.add(data, labels)
    from input_pipelines.core import segmentation_records  # here: --help answers without TF

    return segmentation_records.encode(data, labels), int(labels.min()), int(labels.max())


def _samples(files: Sequence[str], keys: tuple[str, str],
             first: tuple[str, Layout] | None) -> tuple[list[Sample], dict[str, Layout],
                                                        tuple[str, Layout]]:
    layouts: dict[str, Layout] = {}
    samples: list[Sample] = []
    for path in files:
        layouts[path] = inspect(path, *keys)
        first = first or (path, layouts[path])
        check_same_shapes(first[0], first[1], path, layouts[path])
        samples += [(path, i) for i in range(layouts[path].samples)]
    assert first is not None
    return samples, layouts, first


def _stats(manifest: dict[str, Any], sample_shape: Sequence[int]) -> dict[str, Any]:
    channels = ChannelStats(sample_shape[-1])
    classes: list[int] = []
    files = {}
    for split, entry in manifest["splits"].items():
        for shard in entry["shards"]:
            files[shard["file"]] = {"split": split, "samples": shard["examples"],
                                    "label_min": shard["label_min"],
                                    "label_max": shard["label_max"]}
            if split == "train":
                stats = shard["stats"]
                channels.merge(stats["pixels"], np.array(stats["mean"]), np.array(stats["m2"]))
                classes = add_counts(classes, stats["class_pixels"])
    return stats_document(channels, classes, sample_shape, files, "data", "labels")


def convert(input_dir: str, output_dir: str, shards: int, validation_shards: int,
            data_key: str = DATA_KEY, label_key: str = LABEL_KEY,
            workers: int = 1) -> dict[str, list[str]]:
    """Converts the samples under ``input_dir`` into shards under ``output_dir``, reading and
    encoding on ``workers`` processes.

    Returns:
        The shards skipped as already written, per split.

    Raises:
        DataError: missing files or names, samples of differing shapes, bad arguments.
    """
    if min(shards, validation_shards) < 1:
        raise DataError("--shards and --validation_shards must be at least 1")
    suffixes = H5_SUFFIXES + NUMPY_SUFFIXES
    keys = (data_key, label_key)
    found = {"train": split_files(input_dir, "train", suffixes, "--input_dir")}
    try:
        found["validation"] = split_files(input_dir, "validation", suffixes, "--input_dir")
    except DataError:
        pass
    first: tuple[str, Layout] | None = None
    plans = {}
    for split, files in found.items():
        samples, layouts, first = _samples(files, keys, first)
        plans[split] = (samples, layouts)
    assert first is not None
    sample_shape = first[1].sample_shape
    os.makedirs(output_dir, exist_ok=True)
    manifest = load_manifest(output_dir, {"task": SEGMENTATION,
                                          "sample_shape": list(sample_shape)})
    counts = {"train": shards, "validation": validation_shards}
    progress = Progress(f"writing {output_dir}", sum(len(p[0]) for p in plans.values()), 0,
                        unit="samples")
    skipped = {}
    with EncodePool(workers) as pool:
        for split, (samples, layouts) in plans.items():
            identities = []
            for path, index in samples:
                stat = os.stat(path)
                identities.append(f"{os.path.relpath(path, input_dir)}|{index}|{stat.st_size}|"
                                  f"{stat.st_mtime_ns}|{data_key}|{label_key}")
            encode = functools.partial(encode_sample, layouts=layouts, keys=keys)
            skipped[split] = write_split(output_dir, manifest, split, samples, identities,
                                         min(counts[split], len(samples)), encode, ShardStats,
                                         progress, pool)
    progress.done()
    write_json_atomic(os.path.join(output_dir, STATS), _stats(manifest, sample_shape))
    return skipped


def main(argv: Sequence[str] | None = None) -> int:
    parser = converter_parser("input_pipelines.tools.segmentation_to_tfrecord",
                              __doc__.split("\n")[0], "Folder of .h5/.hdf5/.npz files.")
    parser.add_argument("--data_key", default=DATA_KEY, help="Dataset name of the data.")
    parser.add_argument("--label_key", default=LABEL_KEY, help="Dataset name of the labels.")
    args = parser.parse_args(argv)
    return run_converter(args.output_dir, lambda: convert(
        args.input_dir, args.output_dir, args.shards, args.validation_shards, args.data_key,
        args.label_key, args.workers))


if __name__ == "__main__":
    sys.exit(main())
