"""Shared benchmark plumbing: running tfscale.train, the FLOP ceiling, tables and JSON."""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "bench" / "results"
RESNET50_TRAIN_GFLOP = 24.5  # per 224x224 image, forward + backward (~3 x 8.2 GFLOP)


T = TypeVar("T")


def in_round_order(items: Sequence[T], round_: int) -> list[T]:
    """``items`` forward in even rounds (counted from 0) and backward in odd ones, so that
    drift during a round favours no item over the rounds."""
    return list(items) if round_ % 2 == 0 else list(items)[::-1]


def train_command(flags: Sequence[str], model_dir: Path) -> list[str]:
    """``python -m tfscale.train FLAGS`` into ``model_dir``, without TensorBoard's files."""
    return [sys.executable, "-m", "tfscale.train", *flags, f"--model_dir={model_dir}",
            "--tensorboard=false"]


def train(flags: Sequence[str], cores: Sequence[int] | None = None,
          timeout: float = 1800, env: Mapping[str, str] | None = None,
          launcher: Sequence[str] = ()) -> dict[str, Any]:
    """Runs ``python -m tfscale.train FLAGS`` in a fresh model_dir; returns its results.json.

    Args:
        flags: tfscale.train flags (without --model_dir).
        cores: CPU cores the job (and its workers) may use; default all.
        env: variables set for the run on top of this process's environment.
        launcher: a command that starts the ranks, put before it (``mpirun -np 2 ...``).
    """
    with tempfile.TemporaryDirectory() as tmp:
        command = [*launcher, *train_command(flags, Path(tmp) / "run")]
        pin: Callable[[], None] | None = (
            (lambda: os.sched_setaffinity(0, set(cores))) if cores else None)
        proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                              timeout=timeout, preexec_fn=pin, env={**os.environ, **(env or {})})
        if proc.returncode != 0:
            raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stdout[-2000:]}"
                               f"\n{proc.stderr[-2000:]}")
        results: dict[str, Any] = json.loads((Path(tmp) / "run" / "results.json").read_text())
        return results


def run_script(command: Sequence[str], timeout: float = 1800) -> dict[str, Any]:
    """Runs a benchmark helper script that prints one JSON object as its last line."""
    proc = subprocess.run(list(command), cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(command)} failed:\n{proc.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def matmul_gflops(n: int = 4096, repeats: int = 5) -> float:
    """Measured float32 matmul GFLOP/s with TensorFlow on this machine (best of ``repeats``)."""
    import tensorflow as tf

    a = tf.random.uniform((n, n))
    b = tf.random.uniform((n, n))
    (a @ b).numpy()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        (a @ b).numpy()
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def memcpy_gbps(megabytes: int = 256, repeats: int = 5) -> float:
    """Measured memory-copy bandwidth (read + write bytes per second), GB/s."""
    src = np.ones(megabytes * 1024 * 1024 // 4, dtype=np.float32)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - start)
    return 2 * src.nbytes / best / 1e9


def gradient_bytes(model: str) -> int:
    """The bytes of ``model``'s gradients in the mini-cluster's presets, as a whole number of
    float32 values: the size the host-time benches all-reduce."""
    from tfscale.forecast.machines import load

    return int(load("minicluster_25gbit").model(model).gradient_bytes) // 4 * 4


def cpu_description() -> str:
    """The CPU model and its vector/bf16 instruction-set flags (figures depend on them)."""
    from tfscale.training.precision import cpu_info, vector_flags

    model, flags = cpu_info()
    wide = vector_flags(flags)
    return f"{model} ({wide})" if wide else model


def table(rows: Sequence[dict[str, Any]], columns: Sequence[str]) -> str:
    """A Markdown table of ``rows``."""
    def cell(v: Any) -> str:
        return f"{v:.3g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(cell(r.get(c, "")) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


def save(name: str, data: dict[str, Any]) -> Path:
    """Writes ``bench/results/<name>.json`` and returns its path."""
    OUT.mkdir(parents=True, exist_ok=True)
    path = OUT / f"{name}.json"
    path.write_text(json.dumps(data, indent=2) + "\n")
    return path


def add_report_flags(parser: argparse.ArgumentParser) -> None:
    """``--report`` and repeatable ``--result``: a bench's table of saved results."""
    parser.add_argument("--report", action="store_true", help="only the table of --result")
    parser.add_argument("--result", type=Path, action="append", default=[],
                        help="with --report: a saved result (default: the last run's); "
                             "repeated: their rounds pooled")


def pool_rounds(results: Sequence[dict[str, Any]], same: Sequence[str] = ("cpu",)
                ) -> dict[str, Any]:
    """Several saved results of a bench's rounds as one, their rounds numbered on.

    Raises:
        ValueError: for results that differ in one of ``same`` (e.g. their CPUs).
    """
    runs: list[dict[str, Any]] = []
    for result in results:
        for key in same:
            if result[key] != results[0][key]:
                raise ValueError(f"results of different {key}s: {results[0][key]!r} and "
                                 f"{result[key]!r}")
        first = 1 + max((run["round"] for run in runs), default=-1)
        runs += [{**run, "round": first + run["round"]} for run in result["runs"]]
    return {**results[0], "rounds": sum(r["rounds"] for r in results), "runs": runs}


def print_saved_report(parser: argparse.ArgumentParser, paths: Sequence[Path], name: str,
                       report: Callable[[dict[str, Any]], str],
                       same: Sequence[str] = ("cpu",)) -> None:
    """``--report``: the table of the saved results at ``paths`` (default: the last run's,
    ``bench/results/<name>.json``), pooled (:func:`pool_rounds`); a missing or mismatched
    one stops the parser."""
    paths = list(paths) or [OUT / f"{name}.json"]
    for path in paths:
        if not path.exists():
            parser.error(f"--report: no result at {path}; run without --report first")
    try:
        print(report(pool_rounds([json.loads(path.read_text()) for path in paths], same)))
    except ValueError as error:
        parser.error(f"--report: {error}")


CORE_FIELDS = {"user": 0, "system": 2, "idle": 3, "softirq": 6}  # columns of /proc/stat


def core_times(stat: str, cpus: set[int]) -> dict[str, float]:
    """Seconds that ``cpus`` together spent user, system, idle and in softirq since boot, from
    the text of ``/proc/stat``."""
    tick = os.sysconf("SC_CLK_TCK")
    totals = dict.fromkeys(CORE_FIELDS, 0.0)
    for line in stat.splitlines():
        name, *values = line.split() or [""]
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus:
            for field, column in CORE_FIELDS.items():
                totals[field] += int(values[column]) / tick
    return totals
