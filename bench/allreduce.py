"""All-reduce of ResNet-50's gradients between 2 Horovod workers (Gloo on loopback): one grouped
(fused) call vs one call per tensor, and the bus bandwidth reached against this machine's
memory-copy bandwidth. Target: grouped >= 2 x per-tensor.

    python -m bench.allreduce
"""

from __future__ import annotations

import io
import json
import sys
from typing import Any

from bench.common import memcpy_gbps, save, table
from tfscale.scripts.launcher import horovod_envs, supervise

TARGET = 2.0


def measure(workers: int = 2) -> dict[str, Any]:
    envs, server = horovod_envs([("localhost", workers)])
    log = io.StringIO()
    code = supervise([sys.executable, "-m", "bench.allreduce_worker"], envs, out=log,
                     on_exit=server.stop)
    if code != 0:
        raise RuntimeError(f"allreduce workers failed:\n{log.getvalue()[-3000:]}")
    line = next(ln for ln in reversed(log.getvalue().splitlines()) if ln.startswith("[0] {"))
    result: dict[str, Any] = json.loads(line[4:])
    result["memcpy_gbps"] = memcpy_gbps()
    result["speedup"] = result["per_tensor_s"] / result["grouped_s"]
    result["busbw_fraction_of_memcpy"] = result["grouped_busbw_gbps"] / result["memcpy_gbps"]
    result["target"], result["met"] = TARGET, result["speedup"] >= TARGET
    return result


def report(r: dict[str, Any]) -> str:
    rows = [{"call": "grouped (one fused call)", "seconds": r["grouped_s"],
             "bus_GB_per_s": r["grouped_busbw_gbps"]},
            {"call": "one call per tensor", "seconds": r["per_tensor_s"],
             "bus_GB_per_s": r["per_tensor_busbw_gbps"]}]
    return "\n".join([
        f"{r['workers']} workers, {r['tensors']} tensors, {r['megabytes']:.1f} MiB",
        "", table(rows, ["call", "seconds", "bus_GB_per_s"]), "",
        f"grouped is {r['speedup']:.2f} x faster (target >= {TARGET}: "
        f"{'met' if r['met'] else 'NOT met'}); grouped bus bandwidth = "
        f"{r['busbw_fraction_of_memcpy']:.2f} of memory-copy bandwidth "
        f"({r['memcpy_gbps']:.1f} GB/s)",
    ])


def main() -> None:
    result = measure()
    save("allreduce", result)
    print(report(result))


if __name__ == "__main__":
    main()
