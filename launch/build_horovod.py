"""``tfscale-build-horovod [PYTHON]``: build Horovod 0.28.1 for an environment's TensorFlow.

Runs ``build_horovod.sh``, which is installed with this package, so that a ``pip install``
user reaches it without a checkout. PYTHON defaults to the interpreter of this command's own
environment. Also ``python -m launch.build_horovod``. The environment variables the script
reads (``TFSCALE_WITH_MPI``, ``TFSCALE_WHEEL_CACHE``) are documented in BUILD.md.
"""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

SCRIPT = Path(__file__).with_name("build_horovod.sh")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if len(args) > 1:
        print(f"error: expected at most one argument, the Python to build for; got {args}",
              file=sys.stderr)
        return 2
    return subprocess.call(["bash", str(SCRIPT), args[0] if args else sys.executable])


if __name__ == "__main__":
    sys.exit(main())
