"""Worker for the hierarchical all-reduce test: compares it with Horovod's flat all-reduce and
with NumPy on tensors of many shapes, eagerly and inside a ``tf.function``.

Every rank draws its tensors from a generator seeded by its rank, so each rank can also compute
the exact expected sums of all ranks' tensors with NumPy. One dtype group holds small integers
stored as float32, whose sums are exact in any order (and in float16), so there the
hierarchical result must equal the flat one bit for bit. Each rank writes
``OUT/rank<R>.json``.

    python -m tests.workers.simulated_nodes --np 4 --per_node 2 -- \
        python -m tests.workers.hierarchical --out DIR
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
from pathlib import Path
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfscale.cli.command import import_tensorflow  # noqa: E402

import_tensorflow()  # Keras without matplotlib (tests/workers/__init__.py)

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

from tfscale.cli.command import skip_the_last_collection  # noqa: E402
from tfscale.exchange.hierarchical import HierarchicalAllReduce  # noqa: E402

# Sizes 1, 3, 35, 13, 7 are not multiples of 2 or 4; (0,) is empty.
SHAPES = [(), (1,), (3,), (7, 5), (2, 3, 5), (1, 1, 1, 1), (13,), (0,), (7,)]


def tensors_of(rank: int) -> list[np.ndarray]:
    """Rank ``rank``'s tensors: integer-valued float32, then normal float32, then float64."""
    rng = np.random.default_rng(1000 + rank)
    exact = [rng.integers(-50, 50, s).astype(np.float32) for s in SHAPES]
    normal = [rng.normal(size=s).astype(np.float32) for s in SHAPES]
    wide = [rng.normal(size=s) for s in SHAPES[::2]]
    return exact + normal + wide


def max_diff(a: list[Any], b: list[Any]) -> float:
    diffs = [0.0]
    for x, y in zip(a, b, strict=True):
        x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
        assert x.shape == y.shape, (x.shape, y.shape)
        if x.size:
            diffs.append(float(np.max(np.abs(x - y))))
    return max(diffs)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--ddl_local_size", type=int, default=0)
    parser.add_argument("--node_exchange", default="auto")
    args = parser.parse_args()
    reduce = HierarchicalAllReduce.create(local_size=args.ddl_local_size,
                                          node_exchange_mode=args.node_exchange)
    hvd, topo = reduce.hvd, reduce.topology
    mine = tensors_of(topo.rank)
    expected = [sum(np.asarray(t, np.float64) for t in ts)
                for ts in zip(*(tensors_of(r) for r in range(topo.size)), strict=True)]
    exact = len(SHAPES)
    flat = [hvd.allreduce(tf.constant(t), op=hvd.Sum, name=f"flat.{i}")
            for i, t in enumerate(mine)]
    fused = reduce.sum([tf.constant(t) for t in mine])
    alone = [reduce.sum([tf.constant(t)])[0] for t in mine]
    step = tf.function(lambda ts: reduce.sum(ts))
    graph = step([tf.constant(t) for t in mine])
    # What runs the node phases in the step: tfscale's ops, or host calls.
    node_ops = sorted({op.type for op in step.get_concrete_function(
        [tf.constant(t) for t in mine]).graph.get_operations()
        if op.type.startswith("TfscaleNode") or op.type.endswith("PyFunc")})
    mean = reduce([tf.constant(t) for t in mine])
    fp16 = dataclasses.replace(reduce, compression=True, name="fp16").sum(
        [tf.constant(t) for t in mine[:exact]])
    result = {
        "rank": topo.rank, "nodes": [list(n) for n in topo.nodes],
        "node_transport": reduce.node_transport, "node_ops": node_ops,
        "exact_vs_flat": max_diff(fused[:exact], flat[:exact]),
        "exact_alone_vs_flat": max_diff(alone[:exact], flat[:exact]),
        "exact_fp16_vs_flat": max_diff(fp16, flat[:exact]),
        "fused_vs_flat": max_diff(fused, flat),
        "fused_vs_numpy": max_diff(fused, expected),
        "alone_vs_numpy": max_diff(alone, expected),
        "graph_vs_numpy": max_diff(graph, expected),
        "mean_vs_numpy": max_diff(mean, [e / topo.size for e in expected]),
        "dtypes_kept": all(f.dtype == t.dtype for f, t in zip(fused, mine, strict=True)),
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    (Path(args.out) / f"rank{topo.rank}.json").write_text(json.dumps(result))
    # The last phase runs inside a node: a global collective keeps one node from shutting
    # Horovod down while another still exchanges.
    hvd.allreduce(tf.zeros([1]), name="barrier")
    hvd.shutdown()


if __name__ == "__main__":
    main()
    skip_the_last_collection()  # a probe: exit without Python's last collection
