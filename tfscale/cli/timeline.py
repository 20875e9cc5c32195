"""Where Horovod's time went in a training run: its timeline (``--horovod_timeline``) summed up.

Prints one row per activity of Horovod's collectives: how many messages (tensors fused into
one message counted once; negotiations that wait at the same time counted as one wait), the
median and mean milliseconds of each, the seconds in all, and their share of the wall time the
timeline spans. The first ``--skip`` of the timeline is left out: the start-up's broadcasts,
each tensor's first negotiation and the fusion buffer's allocation. Only the chief writes a
timeline, so the rows are rank 0's view: a collective that rank 0 joins last looks shorter
there than on the ranks that waited for it.

    python -m tfscale.cli.timeline MODEL_DIR [--skip 0.1]
    python -m tfscale.cli.timeline MODEL_DIR/horovod_timeline.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tfscale.config.errors import EXIT_ERROR, EXIT_OK
from tfscale.exchange.horovod_timeline import TIMELINE_FILE, load, summarize, table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", type=Path,
                        help=f"a model directory with {TIMELINE_FILE}, or a timeline file")
    parser.add_argument("--skip", type=float, default=0.1,
                        help="fraction of the timeline's time at its start to leave out")
    args = parser.parse_args(argv)
    if not 0 <= args.skip < 1:
        parser.error(f"--skip={args.skip:g}: expected a fraction of the timeline in [0, 1)")
    path = args.path / TIMELINE_FILE if args.path.is_dir() else args.path
    if not path.is_file():
        print(f"{path}: no Horovod timeline there; train with --horovod_timeline (a Horovod "
              f"strategy) to write MODEL_DIR/{TIMELINE_FILE}", file=sys.stderr)
        return EXIT_ERROR
    try:
        events = load(path)  # its errors name the file
    except ValueError as err:
        print(err, file=sys.stderr)
        return EXIT_ERROR
    try:
        rows = summarize(events, args.skip)
    except ValueError as err:
        print(f"{path}: {err}", file=sys.stderr)
        return EXIT_ERROR
    print(f"{path} (rank 0's view; the first {args.skip:.0%} of its time left out)\n")
    print(table(rows))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
