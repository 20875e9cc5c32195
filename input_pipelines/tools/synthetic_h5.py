"""Write synthetic climate-like segmentation samples to HDF5 files, for the file pipelines.

    python -m input_pipelines.tools.synthetic_h5 --out /tmp/seg --train 64 --validation 16

The samples are those of the ``synthetic_seg`` dataset for worker 0
(:mod:`input_pipelines.core.synthetic_fields`), so a run on the files and a run on the
generated stream see the same data.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m input_pipelines.tools.synthetic_h5", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--out", required=True, help="Folder; files go to OUT/train and OUT/validation."
    )
    parser.add_argument("--train", type=int, default=64, help="Training samples.")
    parser.add_argument("--validation", type=int, default=16, help="Validation samples.")
    parser.add_argument("--per_file", type=int, default=1, help="Samples per file.")
    parser.add_argument("--height", type=int, default=64)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--channels", type=int, default=16)
    parser.add_argument("--num_classes", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    # Here, not at the top: --help answers without TensorFlow (synthetic_fields imports it).
    from input_pipelines.core.synthetic_fields import write_h5

    for split, count in (("train", args.train), ("validation", args.validation)):
        if count:
            paths = write_h5(
                os.path.join(args.out, split),
                count,
                args.per_file,
                args.height,
                args.width,
                args.channels,
                args.num_classes,
                args.seed,
                split,
            )
            print(
                f"wrote {count} {split} samples to {len(paths)} file(s) in "
                f"{os.path.join(args.out, split)}"
            )
    print(f"next: python -m input_pipelines.tools.stats --data_dir {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
