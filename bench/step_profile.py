"""Where a two-worker step spends more than one process does, from CPU-clock profiles.

``bench.step_breakdown`` times a step's parts from inside the workers; this samples them from
outside, down to the function, with ``perf`` (Linux's profiler; a VM without hardware counters
still samples the CPU clock). For ``mlp`` (32 px, 1000 classes, batch 64 per worker):

1. ``python -m tfscale.train --strategy=default`` on one core, and ``perf record -e cpu-clock``
   on it for ``--seconds`` once its first step has run;
2. ``--strategy=STRATEGY --num_processes=2 --cpu_binding`` and the same profile of one worker
   (rank 0, the launcher's first child).

Each function's share of the samples times the step time of its run (from the progress lines
printed while it was sampled) is its milliseconds per step; the table shows the functions
whose time grew most from one process to the worker, and the totals by library. Code that a
JIT compiled (oneDNN's kernels) has no symbols and is counted as one entry. A third table
names the TensorFlow op whose kernel each sample ran under (the nearest ``...Op::Compute`` in
its call stack, or tfscale's own exchange kernel, ``tfscale::...::Compute``): Eigen's
element-wise kernels all show as the same unreadable
``std::_Function_handler<...TensorExecutor...>`` by function, and their op says which they
are (on an AMD EPYC, of the kernels that name their op, ``ApplyKerasMomentumOp``, the
update, grew most). JIT-compiled code and Python keep no frame pointers, so their samples
name no op. Recording call stacks (``-g``) adds to the sampling's cost; both runs pay it.

    python -m bench.step_profile [--strategy horovod --seconds 6]

Needs ``perf`` (Debian's ``linux-perf``) and root or ``kernel.perf_event_paranoid`` <= 1.
About a minute and a half on 2 cores. The runs are sequential, not alternated: compare the
functions within one run of this script, not the step times of separate runs.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.common import ROOT, cpu_description, save, table, train_command
from bench.exchange_efficiency import MLP

# Images per worker and step, from the flags (the step time comes from job-wide images/s).
BATCH = int(next(f.split("=", 1)[1] for f in MLP if f.startswith("--batch_size=")))
JIT = "(JIT-compiled code)"
# "  12.34%  libc.so.6   [.] __memmove_avx512_unaligned_erms": share, library, kind, symbol
# (libraries can hold spaces, "[JIT] tid 123"; columns are two or more spaces apart).
_LINE = re.compile(r"^\s*([\d.]+)%\s+(.+?)\s{2,}\[([.kg])\]\s+(.*?)\s*$")
_RATE = re.compile(r"step (\d+)/\d+ .*?([\d.]+) images/s")
# A kernel's frame in a call stack: "tensorflow::ApplyKerasMomentumOp<...>::Compute(...)",
# "tensorflow::(anonymous namespace)::FooOp::Compute", "tensorflow::functor::BarOp<...>::Compute",
# and tfscale's own, whose classes are not named ...Op:
# "tfscale::(anonymous namespace)::NodeAllReduce<float>::Compute".
_OP = re.compile(r"tensorflow::(?:\w+::|\(anonymous namespace\)::)*(\w+Op)(?:<.*?>)?::Compute"
                 r"|tfscale::(?:\w+::|\(anonymous namespace\)::)*(\w+)(?:<.*?>)?::Compute")
NO_OP = "(no TensorFlow op in the stack)"


def parse_report(text: str) -> dict[tuple[str, str], float]:
    """``perf report --no-children --sort dso,sym --stdio`` -> {(library, symbol): share},
    shares as fractions of all samples; JIT-compiled code (no symbols) is one entry."""
    shares: dict[tuple[str, str], float] = collections.defaultdict(float)
    for line in text.splitlines():
        match = _LINE.match(line)
        if not match:
            continue
        share, dso, _, symbol = match.groups()
        if dso.startswith("[JIT]") or dso.startswith("perf-"):
            dso, symbol = JIT, JIT
        shares[(dso.strip(), symbol)] += float(share) / 100.0
    return dict(shares)


def parse_ops(text: str) -> dict[str, float]:
    """``perf script -F ip,sym`` of a profile recorded with call stacks -> {op: share}: each
    sample counted for the innermost TensorFlow kernel (``...Op::Compute``) in its stack, or
    for :data:`NO_OP`; shares as fractions of all samples."""
    counts: collections.Counter[str] = collections.Counter()
    for sample in re.split(r"\n\s*\n", text):
        frames = [line for line in sample.splitlines() if line.strip()]
        if frames:
            counts[next((m.group(1) or m.group(2) for m in map(_OP.search, frames) if m),
                        NO_OP)] += 1
    total = sum(counts.values())
    return {op: n / total for op, n in counts.items()} if total else {}


def step_ms_from(lines: Sequence[str], workers: int) -> float:
    """The mean step time of the progress lines ``lines`` (job-wide images/s)."""
    rates = [float(m.group(2)) for m in map(_RATE.search, lines) if m]
    if not rates:
        raise RuntimeError("no progress line was printed while the run was sampled; "
                           "raise --seconds or lower --log_every")
    return 1000.0 * BATCH * workers / (sum(rates) / len(rates))


def _worker_pid(launcher: int, timeout_s: float = 120.0) -> int:
    """The first worker process the launcher ``launcher`` started (rank 0)."""
    import psutil

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        workers = [p for p in psutil.Process(launcher).children(recursive=True)
                   if "tfscale.train" in " ".join(p.cmdline())]
        if workers:
            return min(p.pid for p in workers)
        time.sleep(0.5)
    raise RuntimeError(f"the launcher (pid {launcher}) started no worker in {timeout_s:g} s")


def _kill_tree(proc: subprocess.Popen[str]) -> None:
    """Kills the run and every process it started (workers may have sessions of their own)."""
    import psutil

    try:
        children = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        children = []
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.kill()
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(timeout=60)
    psutil.wait_procs(children, timeout=60)


def profile_run(flags: Sequence[str], workers: int, seconds: float, log_every: int,
                cores: Sequence[int] | None = None) -> dict[str, Any]:
    """Starts ``tfscale.train FLAGS``, samples one process of it for ``seconds`` once its
    first step has run, then stops it; returns its step time and function shares."""
    with tempfile.TemporaryDirectory(prefix="tfscale-profile-") as tmp:
        command = train_command([*flags, "--steps=1000000", f"--log_every={log_every}"],
                                Path(tmp) / "run")
        pin = (lambda: os.sched_setaffinity(0, set(cores))) if cores else None
        proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True, preexec_fn=pin,
                                start_new_session=True)
        lines: list[str] = []
        started = threading.Event()

        def read() -> None:
            assert proc.stdout is not None
            for line in proc.stdout:
                lines.append(line)
                if "first step compiled" in line:
                    started.set()

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        try:
            if not started.wait(timeout=600):
                raise RuntimeError("the run did not finish its first step in 600 s:\n"
                                   + "".join(lines[-20:]))
            pid = proc.pid if workers == 1 else _worker_pid(proc.pid)
            time.sleep(2.0)  # past the first windows' one-time work
            first = len(lines)
            data = Path(tmp) / "perf.data"
            subprocess.run(["perf", "record", "-q", "-e", "cpu-clock", "-F", "2000", "-g", "-p",
                            str(pid), "-o", str(data), "--", "sleep", str(seconds)],
                           check=True, capture_output=True)
            time.sleep(0.5)
            sampled = lines[first:]
            report = subprocess.run(["perf", "report", "-i", str(data), "--no-children", "-g",
                                     "none", "--sort", "dso,sym", "--stdio"], check=True,
                                    capture_output=True, text=True).stdout
            stacks = subprocess.run(["perf", "script", "-i", str(data), "-F", "ip,sym"],
                                    check=True, capture_output=True, text=True).stdout
        finally:
            _kill_tree(proc)
        return {"step_ms": step_ms_from(sampled, workers), "shares": parse_report(report),
                "ops": parse_ops(stacks)}


def compare(alone: dict[str, Any], worker: dict[str, Any], top: int = 12,
            ) -> dict[str, list[dict[str, Any]]]:
    """The functions, libraries and TensorFlow ops whose milliseconds per step grew most from
    ``alone`` to ``worker`` (each ``profile_run``'s result; ``ops`` may be absent)."""
    def per_step(run: dict[str, Any], by: str) -> dict[str, float]:
        out: dict[str, float] = collections.defaultdict(float)
        if by == "ops":
            for op, share in run.get("ops", {}).items():
                out[op] += share * run["step_ms"]
            return out
        for (dso, symbol), share in run["shares"].items():
            out[dso if by == "libraries" else f"{symbol} ({dso})"] += share * run["step_ms"]
        return out

    result = {}
    for by in ("functions", "libraries", "ops"):
        one, two = per_step(alone, by), per_step(worker, by)
        keys = sorted(set(one) | set(two), key=lambda k: one.get(k, 0.0) - two.get(k, 0.0))
        result[by] = [{"where": k[:110], "one process ms": one.get(k, 0.0),
                       "worker ms": two.get(k, 0.0),
                       "more ms": two.get(k, 0.0) - one.get(k, 0.0)}
                      for k in (keys if by == "libraries" else keys[:top])]
    return result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--strategy", default="horovod")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--log_every", type=int, default=100)
    args = parser.parse_args()
    if shutil.which("perf") is None:
        sys.exit("bench.step_profile needs perf (Debian: apt-get install linux-perf)")
    cores = sorted(os.sched_getaffinity(0))[:1]
    alone = profile_run([*MLP, "--strategy=default"], 1, args.seconds, args.log_every, cores)
    worker = profile_run([*MLP, f"--strategy={args.strategy}", "--num_processes=2",
                          "--cpu_binding"], 2, args.seconds, args.log_every)
    rows = compare(alone, worker)
    save("step_profile", {"cpu": cpu_description(), "strategy": args.strategy,
                          "seconds": args.seconds, "one_process_step_ms": alone["step_ms"],
                          "worker_step_ms": worker["step_ms"], **rows})
    columns = ["where", "one process ms", "worker ms", "more ms"]
    print(f"CPU: {cpu_description()}\nmlp, one process: {alone['step_ms']:.2f} ms a step; "
          f"{args.strategy} x2, one worker: {worker['step_ms']:.2f} ms a step\n")
    print("By function (most added first):\n" + table(rows["functions"], columns))
    print("\nBy library:\n" + table(rows["libraries"], columns))
    print("\nBy TensorFlow op (the kernel each sample ran under):\n"
          + table(rows["ops"], columns))


if __name__ == "__main__":
    main()
