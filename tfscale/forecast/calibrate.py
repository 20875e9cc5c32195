"""``--calibrate``: measure this node with a few steps of ``tfscale.train`` and write the figures
into a machine file.

Two or three child processes (TensorFlow loads only in them):

1. ``python -m tfscale.train ... --dataset=synthetic`` for a few steps: compute time per step
   (data generated on the device costs nothing, as in the Summit practice of tuning compute
   with synthetic data first);
2. a short Python child that loads the model that run saved and counts its trainable weights'
   bytes: the gradient bytes one step exchanges;
3. only when the train flags name another ``--dataset``: the same run on that data; its
   images/s is a lower bound of the input pipeline's rate (the run also computes).
"""

from __future__ import annotations

import datetime
import json
import platform
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tfscale.forecast import machines
from tfscale.training.files import write_json_atomic

SYNTHETIC = "synthetic"
_COUNT_GRADIENT_BYTES = """
import os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
import keras, numpy
model = keras.saving.load_model(sys.argv[1], compile=False)
print(sum(int(numpy.prod(w.shape)) * numpy.dtype(w.dtype).itemsize
          for w in model.trainable_weights))
"""


def _run(command: Sequence[str], timeout_s: int) -> str:
    proc = subprocess.run(list(command), capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-15:])
        raise RuntimeError(f"calibration step failed (exit {proc.returncode}): "
                           f"{' '.join(command)}\n{tail}")
    return proc.stdout


def _train(flags: Sequence[str], model_dir: Path, timeout_s: int) -> dict[str, Any]:
    _run([sys.executable, "-m", "tfscale.train", *flags, f"--model_dir={model_dir}"], timeout_s)
    return json.loads((model_dir / "results.json").read_text())


def _dataset(flags: Sequence[str]) -> str | None:
    """The last ``--dataset`` among ``flags`` (absl lets the last one win)."""
    found = None
    for i, flag in enumerate(flags):
        if flag.startswith("--dataset="):
            found = flag.split("=", 1)[1]
        elif flag == "--dataset" and i + 1 < len(flags):
            found = flags[i + 1]
    return found


def cpu_name() -> str:
    """The CPU's model name (figures differ between machines of the same kind)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def measure(model: str, batch_size: int, precision: str, steps: int,
            train_flags: Sequence[str] = (), timeout_s: int = 900) -> dict[str, Any]:
    """Runs the calibration children; returns the model's machine-file entry.

    Raises:
        ValueError: for ``--precision=auto`` (the file must say which precision it measured).
        RuntimeError: when a child fails, with its last lines.
    """
    if precision == "auto":
        raise ValueError("--calibrate needs an explicit --precision (fp32, mixed_float16, "
                         "mixed_bfloat16): the machine file records the rate per precision")
    common = [f"--model={model}", f"--batch_size={batch_size}", f"--precision={precision}",
              f"--steps={steps}", "--epochs=1", "--num_processes=1", *train_flags]
    with tempfile.TemporaryDirectory(prefix="tfscale-calibrate-") as tmp:
        compute = _train([*common, f"--dataset={SYNTHETIC}"], Path(tmp) / "compute", timeout_s)
        saved = Path(tmp) / "compute" / "model.keras"
        gradient_bytes = int(_run([sys.executable, "-c", _COUNT_GRADIENT_BYTES, str(saved)],
                                  timeout_s).strip().splitlines()[-1])
        dataset = _dataset(train_flags)
        pipeline = None
        if dataset not in (None, SYNTHETIC):
            pipeline = _train(common, Path(tmp) / "pipeline", timeout_s)["images_per_sec"]
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    return {
        "gradient_bytes": gradient_bytes, "batch_size": batch_size, "measured_ranks": 1,
        "images_per_sec": {precision: compute["images_per_sec"]},
        "step_ms": {precision: compute["step_time_ms"]},
        "backward_fraction": 2 / 3, "pipeline_images_per_sec": pipeline,
        "source": (f"tfscale.forecast --calibrate, {when}, on {platform.node()} ({cpu_name()}): "
                   f"{steps} steps of python -m tfscale.train {' '.join(common)} "
                   f"--dataset={SYNTHETIC} (one process; the first step is not timed); "
                   "gradient_bytes counted from the saved model's trainable weights; "
                   + ("pipeline_images_per_sec: the same run on --dataset="
                      f"{dataset}, a lower bound of the pipeline's rate; " if pipeline else "")
                   + "backward_fraction assumed 2/3 (backward ~ twice the forward)"),
    }


def write(base: str, out: Path, model: str, entry: dict[str, Any]) -> machines.Machine:
    """Adds (or replaces) ``model``'s entry in a copy of machine ``base`` written to ``out``,
    keeping the rates measured before at other precisions; validates the result."""
    source = machines.resolve(str(out)) if out.exists() else machines.resolve(base)
    doc = json.loads(source.read_text())
    old = doc.setdefault("models", {}).get(model, {})
    if old.get("batch_size") == entry["batch_size"]:
        entry["images_per_sec"] = {**old.get("images_per_sec", {}), **entry["images_per_sec"]}
        entry["step_ms"] = {**old.get("step_ms", {}), **entry["step_ms"]}
    doc["models"][model] = entry
    machines.parse(doc, out)
    write_json_atomic(out, doc)
    return machines.load(str(out))
