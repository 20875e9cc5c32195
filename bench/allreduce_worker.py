"""One Horovod worker of bench.allreduce: reduces ResNet-50's gradient tensors grouped (one
fused call) and one call per tensor; rank 0 prints one JSON line."""

from __future__ import annotations

import json
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import horovod.tensorflow as hvd  # noqa: E402
import tensorflow as tf  # noqa: E402

from models.resnet50 import resnet50  # noqa: E402


def timed(fn, repeats: int) -> float:  # type: ignore[no-untyped-def]
    fn()  # warm-up: negotiation caches, buffers
    hvd.allreduce(tf.zeros(1), name="barrier0")
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return (time.perf_counter() - start) / repeats


def main() -> None:
    hvd.init()
    shapes = [tuple(v.shape) for v in resnet50().trainable_variables]
    grads = [tf.random.uniform(s) for s in shapes]
    nbytes = sum(int(g.shape.num_elements()) * 4 for g in grads)

    def grouped() -> None:
        for t in hvd.grouped_allreduce(grads, op=hvd.Average):
            t.numpy()

    def per_tensor() -> None:
        for i, g in enumerate(grads):
            hvd.allreduce(g, op=hvd.Average, name=f"g{i}").numpy()

    t_grouped, t_single = timed(grouped, 5), timed(per_tensor, 3)
    n = hvd.size()
    bus = 2 * (n - 1) / n * nbytes
    if hvd.rank() == 0:
        print(json.dumps({"workers": n, "tensors": len(grads), "megabytes": nbytes / 2**20,
                          "grouped_s": t_grouped, "per_tensor_s": t_single,
                          "grouped_busbw_gbps": bus / t_grouped / 1e9,
                          "per_tensor_busbw_gbps": bus / t_single / 1e9}))


if __name__ == "__main__":
    main()
