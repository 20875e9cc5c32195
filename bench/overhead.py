"""Overhead of tfscale.train against a plain Keras script (same model, batch, optimizer, data,
precision and threads: fp32, TensorFlow's default thread pools in both).

Each round runs both, in alternating order (plain first in even rounds, tfscale.train first in
odd ones), so drift in the machine's speed favours neither. The ratio is per round (tfscale /
plain of that round); the result is the median over the rounds. Target (issue 40): >= 1.00.

On a VM whose speed drifts by more than the gap between rounds (a third within an hour on a
2-core AMD EPYC), ``--side_by_side`` runs the two at the same time instead, each on a core of
its own with one TensorFlow thread of each kind, the cores swapped every round: both see the
same drift, and the ratio of a round compares runs that shared the machine's state. The two
do not start or end their timed steps together, so a run's own figure counts steps taken
while the other was still starting or had ended (the one that exits later records how long
it ran after the other had exited, its last steps and its own exit: ``alone_at_end_s``).
The round's ratio is therefore taken over the window in which both were in steady steps
(after each one's first timed step, which is slower in both programs: ``WARMUP_STEPS``):
each prints a line at every step's end (``--log_every=1``, ``--step_lines``), this script
stamps the lines as they come, and each run's rate is its whole steps inside the window
(``window_images_per_sec``). Each row keeps its step ends and exit, in seconds from the
start (``step_ends_s``, ``exited_s``).

    python -m bench.overhead [--rounds 4 --steps 6 --batch_size 32] [--side_by_side]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from bench.common import (
    ROOT,
    cpu_description,
    in_round_order,
    run_script,
    save,
    table,
    train,
    train_command,
)

TARGET = 1.00
RUNS = ("plain keras", "tfscale.train")


# A step's end as both runs print it: tfscale.train's progress line, plain Keras' --step_lines.
STEP_LINE = re.compile(r"^step (\d+)/\d+\b")


def _plain_command(steps: int, batch: int, image_size: int, threads: int = 0,
                   step_lines: bool = False) -> list[str]:
    return [sys.executable, "-m", "bench.plain_keras", f"--batch_size={batch}",
            f"--steps={steps}", f"--image_size={image_size}", f"--threads={threads}",
            *(["--step_lines"] if step_lines else [])]


def _tfscale_flags(steps: int, batch: int, image_size: int, threads: int = 0,
                   step_lines: bool = False) -> list[str]:
    return ["--model=resnet50", f"--batch_size={batch}", f"--steps={steps}",
            f"--image_size={image_size}", "--learning_rate=0.01", "--precision=fp32",
            f"--log_every={1 if step_lines else steps}", f"--intra_op_threads={threads}",
            f"--inter_op_threads={threads}"]


def _rates(result: dict[str, Any]) -> dict[str, Any]:
    return {key: result[key] for key in ("steps", "images_per_sec", "step_time_ms")}


def one(run: str, steps: int, batch: int, image_size: int) -> dict[str, Any]:
    if run == "plain keras":
        return dict(run_script(_plain_command(steps, batch, image_size)))
    return _rates(train(_tfscale_flags(steps, batch, image_size)))


def _on_core(core: int) -> Callable[[], None]:
    return lambda: os.sched_setaffinity(0, {core})


def _stamp_steps(stream: IO[bytes], path: Path, ends: list[tuple[int, float]]) -> None:
    """Copies ``stream`` to ``path`` and appends (step, monotonic time) for each step line."""
    with open(path, "wb") as sink:
        for line in iter(stream.readline, b""):
            now = time.monotonic()
            sink.write(line)
            match = STEP_LINE.match(line.decode(errors="replace"))
            if match:
                ends.append((int(match.group(1)), now))


#: Timed steps at each run's start left out of the window: on the Xeon of 2026-12-05 the first
#: step after compilation took 1.4-1.8x the steady step in both programs (14.5-18.5 s against
#: 9.6-11.7), plain Keras' with the other core in steady steps; a window that began at one
#: run's first timed step and inside the other's steady ones would count that cost for one
#: only (bench/RESULTS.md, "Both programs timed over the same minutes").
WARMUP_STEPS = 1


def common_window(ends: Mapping[str, Sequence[tuple[int, float]]], batch: int,
                  warmup: int = WARMUP_STEPS) -> dict[str, dict[str, Any]]:
    """Each run's images/s over the window in which every run was in steady steps.

    ``ends`` holds, per run, (step, time) at each step's end, step 1 first. A run's steady
    steps begin when step ``1 + warmup`` ends: step 1 is tracing and compilation, which its
    meter leaves out, and the ``warmup`` steps after it run slower in both programs
    (:data:`WARMUP_STEPS`). The window runs from the latest such start to the earliest last
    step end. Each run's rate is its whole steps inside the window: from its first step end
    in it to its last.

    Raises:
        ValueError: a run without step 1's end, or a window that holds fewer than two step
            ends of some run (more ``--steps`` give a longer one).
    """
    for run, stamps in ends.items():
        if not stamps or stamps[0][0] != 1:
            raise ValueError(f"{run}: no line for step 1's end in its output "
                             f"(got steps {[step for step, _ in stamps][:5]})")
    start = max(stamps[min(warmup, len(stamps) - 1)][1] for stamps in ends.values())
    end = min(stamps[-1][1] for stamps in ends.values())
    rates = {}
    for run, stamps in ends.items():
        inside = [t for _, t in stamps if start <= t <= end]
        if len(inside) < 2:
            raise ValueError(
                f"{run}: {len(inside)} step end(s) in the {max(end - start, 0):.1f} s in which "
                "both runs were in steady steps; give more --steps")
        rates[run] = {"window_images_per_sec": round(
                          batch * (len(inside) - 1) / (inside[-1] - inside[0]), 3),
                      "window_steps": len(inside) - 1,
                      "window_s": round(end - start, 1)}
    return rates


def side_by_side(round_: int, steps: int, batch: int, image_size: int,
                 timeout: float = 3600) -> dict[str, dict[str, Any]]:
    """Both runs at once, each on a core of its own with one thread of each kind; plain Keras
    on the first core in even rounds, on the second in odd ones. Each run's row has its own
    figures, its rate in the window in which both were in steady steps
    (:func:`common_window`), its step ends and exit in seconds from the start, and, for the
    run that exits later, how long it ran after the other had exited (``alone_at_end_s``:
    its last steps and its exit)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        raise SystemExit("--side_by_side needs two cores")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = Path(tmp) / "run"
        commands = {
            "plain keras": _plain_command(steps, batch, image_size, threads=1,
                                          step_lines=True),
            "tfscale.train": train_command(
                _tfscale_flags(steps, batch, image_size, threads=1, step_lines=True),
                model_dir)}
        out = {run: Path(tmp) / f"{index}.out" for index, run in enumerate(RUNS)}
        procs: dict[str, subprocess.Popen[bytes]] = {}
        readers: list[threading.Thread] = []
        ends: dict[str, list[tuple[int, float]]] = {run: [] for run in RUNS}
        ended: dict[str, float] = {}
        env = {**os.environ, "PYTHONUNBUFFERED": "1"}
        started = time.monotonic()
        try:
            for run, core in zip(in_round_order(RUNS, round_), cores, strict=False):
                procs[run] = subprocess.Popen(
                    commands[run], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                    env=env, start_new_session=True, preexec_fn=_on_core(core))
                readers.append(threading.Thread(
                    target=_stamp_steps, args=(procs[run].stdout, out[run], ends[run]),
                    daemon=True))
                readers[-1].start()
            deadline = time.monotonic() + timeout
            while len(ended) < len(procs) and time.monotonic() < deadline:
                for run, proc in procs.items():
                    if run not in ended and proc.poll() is not None:
                        ended[run] = time.monotonic()
                time.sleep(0.05)
        finally:
            for proc in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            for reader in readers:
                reader.join(timeout=30)
        for run, proc in procs.items():
            if run not in ended or proc.returncode != 0:
                why = "timed out" if run not in ended else "failed"
                raise RuntimeError(f"{' '.join(commands[run])} {why}:\n"
                                   f"{out[run].read_text(errors='replace')[-3000:]}")
        plain = json.loads(out["plain keras"].read_text().strip().splitlines()[-1])
        ours = json.loads((model_dir / "results.json").read_text())
        rows = {"plain keras": _rates(plain), "tfscale.train": _rates(ours)}
        for run, window in common_window(ends, batch).items():
            rows[run].update(window)
        for run, stamps in ends.items():
            rows[run]["step_ends_s"] = [round(t - started, 2) for _, t in stamps]
            rows[run]["exited_s"] = round(ended[run] - started, 1)
        later = max(ended, key=ended.__getitem__)
        rows[later]["alone_at_end_s"] = round(ended[later] - min(ended.values()), 1)
        return rows


def measure(rounds: int, steps: int, batch: int, image_size: int,
            together: bool = False) -> dict[str, Any]:
    rows = []
    ratios = []
    for round_ in range(rounds):
        if together:
            results = side_by_side(round_, steps, batch, image_size)
        else:
            results = {run: one(run, steps, batch, image_size)
                       for run in in_round_order(RUNS, round_)}
        for run, result in results.items():
            rows.append({"round": round_ + 1, "run": run, **result})
        rate = "window_images_per_sec" if together else "images_per_sec"
        ratios.append(float(results["tfscale.train"][rate])
                      / float(results["plain keras"][rate]))
    ratio = statistics.median(ratios)
    return {"cpu": cpu_description(), "rows": rows, "ratios": ratios,
            "plain_images_per_sec": statistics.median(
                r["images_per_sec"] for r in rows if r["run"] == "plain keras"),
            "tfscale_images_per_sec": statistics.median(
                r["images_per_sec"] for r in rows if r["run"] == "tfscale.train"),
            "ratio": ratio, "target": TARGET, "met": ratio >= TARGET,
            "setup": {"model": "resnet50", "batch_size": batch, "image_size": image_size,
                      "timed_steps_per_run": steps - 1, "rounds": rounds,
                      "side_by_side": together,
                      "threads": "1 intra, 1 inter, a core each" if together
                      else "TensorFlow's defaults"}}


def report(result: dict[str, Any]) -> str:
    return "\n".join([
        table(result["rows"], ["round", "run", "images_per_sec", "step_time_ms"]
              + (["window_images_per_sec", "window_steps", "window_s", "alone_at_end_s"]
                 if result.get("setup", {}).get("side_by_side") else [])),
        "",
        f"CPU: {result.get('cpu', '?')}",
        "runs: " + ("side by side, a core and one thread each, the cores swapped every round; "
                    "the ratio over the window in which both were in steady steps"
                    if result.get("setup", {}).get("side_by_side")
                    else "one after the other, TensorFlow's default threads"),
        "tfscale / plain per round: " + ", ".join(f"{r:.3f}" for r in result.get("ratios", [])),
        f"tfscale / plain = {result['ratio']:.3f}, median of the rounds (target >= {TARGET}: "
        f"{'met' if result['met'] else 'NOT met'})",
    ])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--image_size", type=int, default=224)
    parser.add_argument("--side_by_side", action="store_true",
                        help="run the two at once, a core and one thread each (see above)")
    args = parser.parse_args()
    result = measure(args.rounds, args.steps, args.batch_size, args.image_size,
                     args.side_by_side)
    save("overhead", result)
    print(report(result))


if __name__ == "__main__":
    main()
