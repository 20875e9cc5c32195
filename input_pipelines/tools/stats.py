"""Per-channel normalization statistics of training data, stored beside it as stats.json.

    python -m input_pipelines.tools.stats --data_dir /data/climate \\
        [--data_key data --label_key labels] [--workers N]
    python -m input_pipelines.tools.stats --data_dir /data/digits

Segmentation data: reads every training sample (HDF5/NumPy files, or the TFRecord shards of
``segmentation_to_tfrecord``) and writes ``DATA_DIR/stats.json``: the per-channel mean and
standard deviation of the training data, the class frequencies, the sample shapes, the names of
the data and label datasets, and each file's sample count and label range (validation files
included), which the pipelines use to check labels against ``--num_classes`` before training.
The TFRecord converter writes the same file as it converts.

An image folder (class sub-folders, under ``train/`` or directly in ``DATA_DIR``): decodes every
training image and writes ``pixel_stats`` (per-channel mean and standard deviation in pixel
units, 0-255, of the images decoded to RGB and to grayscale), what ``--normalization=dataset``
of the ``image_folder`` dataset uses. ``folder_to_tfrecord`` records the same in its manifest.

Files (segmentation) or images are read on ``--workers`` processes (default: every core for more
than 64 MiB of data; below that, this process alone, as starting the workers costs more), with a
progress line of files, samples or images, their rate and the time left; the result is the same
for any number of workers.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

import numpy as np

from input_pipelines.core.stats import STATS, compute, compute_images, is_image_folder
from tfscale.training.files import write_json_atomic


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m input_pipelines.tools.stats",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--data_dir", required=True,
                        help="Folder of the segmentation data, or an image folder (class "
                        "sub-folders, optionally under train/).")
    parser.add_argument("--data_key", default="data", help="Dataset name of the data.")
    parser.add_argument("--label_key", default="labels", help="Dataset name of the labels.")
    parser.add_argument("--workers", type=int, default=0,
                        help="Processes reading files or decoding images (default 0: the cores "
                        "this process may use for more than 64 MiB of data, else 1).")
    args = parser.parse_args(argv)
    path = os.path.join(args.data_dir, STATS)
    try:
        if is_image_folder(args.data_dir):
            document = compute_images(args.data_dir, args.workers)
            rgb = document["pixel_stats"]["3"]
            summary = (f"{document['images']} training images, RGB mean "
                       f"{np.round(rgb['mean'], 2).tolist()}, std "
                       f"{np.round(rgb['std'], 2).tolist()} (0-255)")
        else:
            document = compute(args.data_dir, args.data_key, args.label_key, args.workers)
            summary = (f"{document['samples']} training samples, mean "
                       f"{np.round(document['mean'], 4).tolist()}, std "
                       f"{np.round(document['std'], 4).tolist()}")
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    write_json_atomic(path, document)
    print(f"wrote {path}: {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
