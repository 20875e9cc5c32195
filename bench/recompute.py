"""Activation recomputation (``--recompute``): peak memory and step time with and without it,
and the largest batch that fits under a memory cap with and without it.

Every configuration trains a few steps of ``tfscale.training.trainer`` on ``synthetic_seg`` in a
fresh
process (``--worker``), alternating without/with over the rounds. Peak memory is the process's
peak resident set (VmHWM, what the machine must hold) and TensorFlow's allocator peak
(``tf.config.experimental.get_memory_info`` of the GPU where there is one, else of the CPU);
step time is tfscale's (the first step, which traces, is left out). The batch search runs each
batch under a watchdog that kills the worker once its resident set passes the cap; a batch fits
when its run finished with a peak under the cap. Target: peak memory >= 30% lower.

    python -m bench.recompute            # about 8 minutes on 2 cores
    python -m bench.recompute --rounds 1 --steps 3 --no_search
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench.common import OUT, ROOT, cpu_description, save, table

TARGET = 0.30
COMPARE = (("deeplabv3plus", 768, 2), ("tiramisu56", 384, 2))  # (model, image size, batch)
SEARCH = ("tiramisu56", 128, 2560)  # (model, image size, cap in MiB)
COMMON = {"dataset": "synthetic_seg", "input_channels": 16, "num_classes": 3,
          "learning_rate": 0.01, "tensorboard": False}


def _worker(settings: dict[str, Any]) -> None:
    """Trains ``settings`` (TrainConfig fields) in this process and prints one JSON line."""
    from tfscale.cli import plugins
    from tfscale.config.train_config import TrainConfig
    from tfscale.training import trainer

    with tempfile.TemporaryDirectory() as tmp:
        config = TrainConfig(**settings, model_dir=tmp)
        results = trainer.run(config, plugins.parts(config))
    import tensorflow as tf

    device = "GPU:0" if tf.config.list_physical_devices("GPU") else "CPU:0"
    try:
        allocator_peak = tf.config.experimental.get_memory_info(device)["peak"] / 2**20
    except ValueError:  # an allocator that keeps no statistics
        allocator_peak = None
    print(json.dumps({"peak_rss_mb": _status_mb(os.getpid(), "VmHWM"),
                      "allocator_peak_mb": allocator_peak, "allocator": device,
                      "step_time_ms": results["step_time_ms"],
                      "final_loss": results["final_loss"]}))


def _status_mb(pid: int, key: str) -> float:
    """A memory figure (``VmRSS``, ``VmHWM``) of process ``pid`` in MiB; 0 once it is gone."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(f"{key}:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def run(settings: dict[str, Any], cap_mb: float | None = None,
        timeout: float = 900) -> dict[str, Any]:
    """Runs one worker; with ``cap_mb`` it is killed once its resident set passes the cap.

    Returns:
        The worker's figures, or ``{"fits": False, ...}`` when it was killed or failed; with a
        cap, ``fits`` says whether it finished under it.
    """
    with tempfile.TemporaryFile("w+") as log:
        proc = subprocess.Popen([sys.executable, "-m", "bench.recompute", "--worker",
                                 json.dumps(settings)], cwd=ROOT, stdout=log,
                                stderr=subprocess.STDOUT, text=True)
        killed = threading.Event()

        def watch() -> None:
            while proc.poll() is None:
                if cap_mb and _status_mb(proc.pid, "VmRSS") > cap_mb:
                    killed.set()
                    proc.kill()
                time.sleep(0.05)

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        watcher.join()
        log.seek(0)
        output = log.read()
    if killed.is_set():
        return {"fits": False, "killed_at_mb": cap_mb}
    if proc.returncode != 0:
        return {"fits": False, "error": output[-1500:]}
    result: dict[str, Any] = json.loads(output.strip().splitlines()[-1])
    result["fits"] = cap_mb is None or result["peak_rss_mb"] <= cap_mb
    return result


def _settings(model: str, size: int, batch: int, steps: int, recompute: bool) -> dict[str, Any]:
    return {**COMMON, "model": model, "image_size": size, "batch_size": batch, "steps": steps,
            "log_every": steps, "recompute": recompute}


def compare(model: str, size: int, batch: int, rounds: int, steps: int) -> dict[str, Any]:
    """Peak memory and step time without and with recomputation, alternating over rounds."""
    runs: dict[bool, list[dict[str, Any]]] = {False: [], True: []}
    for _ in range(rounds):
        for recompute in (False, True):
            result = run(_settings(model, size, batch, steps, recompute))
            if "error" in result:
                raise RuntimeError(f"{model} recompute={recompute} failed:\n{result['error']}")
            runs[recompute].append(result)
            print(model, size, batch, "recompute" if recompute else "plain", result, flush=True)

    def best(recompute: bool, key: str) -> float:
        values = [r[key] for r in runs[recompute] if r.get(key) is not None]
        return min(values) if values else float("nan")

    row: dict[str, Any] = {"model": model, "input": f"{size}x{size}x16", "batch": batch}
    for key, name in (("peak_rss_mb", "rss"), ("allocator_peak_mb", "allocator"),
                      ("step_time_ms", "step_ms")):
        plain, recomputed = best(False, key), best(True, key)
        row[f"{name}_plain"], row[f"{name}_recompute"] = plain, recomputed
        row[f"{name}_ratio"] = recomputed / plain
    row["rss_saving"] = 1 - row["rss_ratio"]
    row["allocator_saving"] = 1 - row["allocator_ratio"]
    return {"row": row, "runs": {"plain": runs[False], "recompute": runs[True]}}


def largest_batch(model: str, size: int, cap_mb: float, recompute: bool,
                  steps: int = 2) -> dict[str, Any]:
    """The largest batch whose run stays under ``cap_mb``: two probes give the memory per
    example, then batches around the prediction are run until one fits and the next not."""
    probes: dict[int, dict[str, Any]] = {}

    def fits(batch: int) -> bool:
        if batch not in probes:
            probes[batch] = run(_settings(model, size, batch, steps, recompute), cap_mb)
            print(model, size, "recompute" if recompute else "plain", "batch", batch,
                  probes[batch], flush=True)
        return bool(probes[batch]["fits"])

    if not fits(1):
        batch = 0
    elif not fits(2):
        batch = 1
    else:
        per_example = probes[2]["peak_rss_mb"] - probes[1]["peak_rss_mb"]
        batch = max(2, int((cap_mb - probes[1]["peak_rss_mb"]) / max(per_example, 1)) + 1)
        while fits(batch + 1):
            batch += 1
        while not fits(batch):
            batch -= 1
    return {"largest_batch": batch, "probes": {str(b): p for b, p in sorted(probes.items())}}


def measure(rounds: int, steps: int, search: bool) -> dict[str, Any]:
    import tensorflow as tf

    result: dict[str, Any] = {
        "cpu": cpu_description(), "cores": os.cpu_count(), "tensorflow": tf.__version__,
        "gpu": [d.name for d in tf.config.list_physical_devices("GPU")],
        "memory_gb": os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9,
        "setup": {"rounds": rounds, "steps": steps, "timed_steps": steps - 1, **COMMON},
        "comparisons": [compare(m, s, b, rounds, steps) for m, s, b in COMPARE],
    }
    if search:
        model, size, cap = SEARCH
        result["batch_search"] = {
            "model": model, "input": f"{size}x{size}x16", "cap_mb": cap,
            "plain": largest_batch(model, size, cap, recompute=False),
            "recompute": largest_batch(model, size, cap, recompute=True),
        }
    savings = [c["row"]["rss_saving"] for c in result["comparisons"]]
    result["target"] = TARGET
    result["met"] = min(savings) >= TARGET
    return result


def report(result: dict[str, Any]) -> str:
    rows = [c["row"] for c in result["comparisons"]]
    lines = [
        f"{result['cpu']}, {result['cores']} cores, {result['memory_gb']:.0f} GB, "
        f"TensorFlow {result['tensorflow']}; best of {result['setup']['rounds']} alternating "
        f"rounds, {result['setup']['timed_steps']} timed steps each",
        "",
        table(rows, ["model", "input", "batch", "rss_plain", "rss_recompute", "rss_saving",
                     "allocator_plain", "allocator_recompute", "allocator_saving",
                     "step_ms_plain", "step_ms_recompute", "step_ms_ratio"]),
        "",
        "MB = MiB; rss = the process's peak resident set, allocator = TensorFlow's allocator "
        "peak; step_ms_ratio = recompute / plain step time.",
    ]
    search = result.get("batch_search")
    if search:
        lines += ["", f"Largest batch of {search['model']} at {search['input']} under a "
                      f"{search['cap_mb']} MiB resident-set cap: "
                      f"{search['plain']['largest_batch']} without, "
                      f"{search['recompute']['largest_batch']} with recomputation."]
    worst = min(r["rss_saving"] for r in rows)
    lines += ["", f"peak RSS saving: {worst:.1%} at worst (target >= {result['target']:.0%}: "
                  f"{'met' if result['met'] else 'NOT met'})"]
    return "\n".join(lines)


def main() -> None:
    if sys.argv[1:2] == ["--worker"]:
        _worker(json.loads(sys.argv[2]))
        return
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--no_search", action="store_true", help="skip the batch search")
    args = parser.parse_args()
    start = time.time()
    result = measure(args.rounds, args.steps, not args.no_search)
    result["benchmark_seconds"] = time.time() - start
    save("recompute", result)
    text = report(result)
    (OUT / "recompute.md").write_text(f"# Activation recomputation\n\n{text}\n")
    print(text)


if __name__ == "__main__":
    main()
