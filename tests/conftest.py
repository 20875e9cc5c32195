"""Shared test helpers: running tfscale as real processes, always bounded and cleaned up."""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
# XLA compiles without LLVM's optimizations in the tests (and their child processes): the same
# HLO, results within the tests' tolerances, and a third less compile time (tiramisu_tiny's
# recompute case: 35 -> 22 s alone, Xeon). bench/ keeps XLA's defaults.
if "xla_backend_optimization_level" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                               + " --xla_backend_optimization_level=0").strip()
ROOT = Path(__file__).resolve().parents[1]
TINY = ["--model=tiny_cnn", "--image_size=16", "--num_classes=4", "--batch_size=4",
        "--log_every=1", "--tensorboard=false"]


def run_process(
    command: list[str], timeout: float = 240, env: dict[str, str] | None = None,
    cwd: Path = ROOT,
) -> subprocess.CompletedProcess[str]:
    """Runs ``command`` from ``cwd`` (the repo root) in its own process group; on timeout the
    whole group is killed and the test fails with the output so far."""
    full_env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    proc = subprocess.Popen(command, cwd=cwd, env=full_env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"timed out after {timeout}s: {command}\n{out}\n{err}")
    return subprocess.CompletedProcess(command, proc.returncode, out, err)


def run_on_one_node(target: Callable[..., None], size: int, directory: Path,
                    timeout: float = 60) -> dict[int, tuple[Any, ...]]:
    """Runs ``target(index, size, str(directory), queue)`` in ``size`` spawned processes (the
    local processes of one node) and returns what each put on the queue, ``(index, *rest)``,
    as ``{index: rest}``; every process is ended, also when one fails."""
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    procs = [context.Process(target=target, args=(i, size, str(directory), queue))
             for i in range(size)]
    for p in procs:
        p.start()
    try:
        results = {}
        for _ in procs:
            index, *rest = queue.get(timeout=timeout)
            results[index] = tuple(rest)
        return results
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()


@pytest.fixture
def tmpfs(tmp_path: Path) -> Iterator[Callable[[str], Path]]:
    """``tmpfs(size)`` mounts a tmpfs of ``size`` ("1m") in ``tmp_path`` and returns it: a
    ``/dev/shm`` too small for some segments. Unmounted after the test; mounting needs root."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    mounted: list[Path] = []

    def mount(size: str) -> Path:
        directory = tmp_path / f"tmpfs{len(mounted)}"
        directory.mkdir()
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(directory)],
                       check=True)
        mounted.append(directory)
        return directory

    try:
        yield mount
    finally:
        for directory in mounted:
            subprocess.run(["umount", "--lazy", str(directory)], check=False)


def run_train(*flags: str, timeout: float = 240,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m tfscale.train FLAGS`` as a subprocess."""
    return run_process([sys.executable, "-m", "tfscale.train", *flags], timeout, env)


def read_results(model_dir: Path) -> dict[str, Any]:
    return json.loads((model_dir / "results.json").read_text())


def horovodrun() -> str:
    return str(Path(sys.executable).with_name("horovodrun"))


requires_horovod = pytest.mark.skipif(
    not Path(sys.executable).with_name("horovodrun").exists(),
    reason="Horovod is not installed in this environment (run launch/setup.sh)",
)


# The files that take longest (minutes of real processes), collected first: pytest-xdist's
# --dist loadfile (make test) then starts them first instead of finishing with one of them alone.
LONGEST_FIRST = ("test_minicluster.py", "test_reliability.py", "test_strategies.py",
                 "test_recompute.py", "test_ddl.py", "test_xla_precision.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: index for index, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


def assert_exchange_share_logged(stdout: str, model_dir: Path, steps: list[int]) -> None:
    """Several workers: each progress line after the compiled first step shows the exchange's
    share, and TensorBoard holds it (a fraction) and the exchange's ms per step at each."""
    import tensorflow as tf

    lines = [ln for ln in stdout.splitlines() if "images/s (exchange " in ln]
    assert len(lines) == len(steps), stdout[-3000:]
    seen: dict[str, dict[int, float]] = {}
    for path in sorted((model_dir / "tensorboard" / "steps").glob("events.out.tfevents*")):
        for event in tf.compat.v1.train.summary_iterator(str(path)):
            for value in event.summary.value:
                seen.setdefault(value.tag, {})[event.step] = float(
                    tf.make_ndarray(value.tensor))
    assert sorted(seen["step/exchange_share"]) == steps, seen
    assert sorted(seen["step/exchange_ms"]) == steps, seen
    assert all(0 < v < 1 for v in seen["step/exchange_share"].values()), seen
    assert all(v > 0 for v in seen["step/exchange_ms"].values()), seen
