"""Runs an example script as ``__main__``, unchanged, then records what it trained, for the
tests of examples/others: ``OUT/rank<R>.npz`` (the weights of the Keras model the script left
in its globals) and ``OUT/rank<R>.json`` (its ``fit`` history's losses per epoch).

    tfscale-run --nproc=2 -m tests.workers.run_example SCRIPT OUT
"""

from __future__ import annotations

import json
import runpy
import sys
from pathlib import Path


def main() -> None:
    script, out = sys.argv[1], Path(sys.argv[2])
    sys.argv = [script]
    names = runpy.run_path(script, run_name="__main__")
    import keras
    import numpy as np

    from tfscale.cluster import environment as cluster_env

    model = next(v for v in names.values() if isinstance(v, keras.Model))
    rank = cluster_env.this_process().rank
    np.savez(out / f"rank{rank}.npz", *[np.asarray(w) for w in model.get_weights()])
    (out / f"rank{rank}.json").write_text(json.dumps({"loss": model.history.history["loss"]}))


if __name__ == "__main__":
    main()
