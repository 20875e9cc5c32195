"""Where the test suite's CPU goes: every Python process a pytest run starts, by test.

    python -m bench.suite_census [--out DIR] [--top N] [-- PYTEST_ARGS ...]

Runs ``python -m pytest PYTEST_ARGS`` (default: the README's ``-n 2 --dist loadfile`` over
``tests/``) with a ``sitecustomize`` on the ``PYTHONPATH`` that logs, when each Python process
ends, its test (``PYTEST_CURRENT_TEST``, which child processes inherit), its command, whether it
had loaded TensorFlow, and its CPU seconds (user + system). The report says how busy the
machine's cores were, how many processes loaded TensorFlow and what they cost, and which tests
and commands spent the most. Most of the suite's CPU goes to TensorFlow's start-up (3-4 s of
CPU per process on an AMD EPYC Zen 4, 6-8 s on an AVX2-only one), so the number of TensorFlow
processes per test is what a cut of CI time has to reduce.

Not logged: processes killed by a signal (they run no exit hook) and processes started with an
environment that drops ``PYTHONPATH`` (a test's own ``env=``). The pytest workers' line holds the
tests that run TensorFlow in the worker itself.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.common import ROOT, cpu_description

LOG_VARIABLE = "TFSCALE_SUITE_CENSUS_LOG"
# Logged at exit, also through os._exit (worker processes and forked children end that way).
HOOK = f'''
import os, sys, json, resource

def _tfscale_census_log():
    try:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        record = {{"pid": os.getpid(), "test": os.environ.get("PYTEST_CURRENT_TEST", ""),
                   "argv": " ".join(sys.argv[:3])[:200],
                   "tensorflow": "tensorflow" in sys.modules,
                   "cpu_s": round(usage.ru_utime + usage.ru_stime, 3)}}
        with open(os.environ["{LOG_VARIABLE}"], "a") as log:
            log.write(json.dumps(record) + "\\n")
    except Exception:
        pass

if os.environ.get("{LOG_VARIABLE}"):
    import atexit
    atexit.register(_tfscale_census_log)
    _tfscale_exit = os._exit

    def _census_exit(code):
        _tfscale_census_log()
        _tfscale_exit(code)

    os._exit = _census_exit
'''
PYTEST_DEFAULT = ["-q", "-n", "2", "--dist", "loadfile", "tests"]


def owning_test(record: dict[str, Any]) -> str:
    """The test a process ran for (its ``PYTEST_CURRENT_TEST`` without the phase), or
    ``(pytest workers)`` for processes outside any test."""
    name = str(record.get("test", "")).rsplit(" (", 1)[0]
    return name or "(pytest workers)"


def command_of(record: dict[str, Any]) -> str:
    """A process's command, without the temporary paths that make each run's line unique."""
    words = str(record.get("argv", "")).split()
    return " ".join(w for w in words[:2] if "/tmp/" not in w) or "(no argv)"


def summarize(records: Iterable[dict[str, Any]], top: int = 20,
              busy: float | None = None) -> str:
    """The report on a census's records (see the module's text)."""
    records = list(records)
    lines = []
    if busy is not None:
        lines.append(f"cores busy: {busy:.1%} of the run's wall time")
    tf = [r for r in records if r["tensorflow"]]
    total = sum(r["cpu_s"] for r in records)
    lines.append(f"{len(records)} Python processes logged, {total:.0f} s of CPU; "
                 f"{len(tf)} loaded TensorFlow, {sum(r['cpu_s'] for r in tf):.0f} s of CPU")
    for title, key in (("tests", owning_test), ("commands", command_of)):
        cpu: dict[str, float] = collections.defaultdict(float)
        count: collections.Counter[str] = collections.Counter()
        for record in records:
            cpu[key(record)] += record["cpu_s"]
            count[key(record)] += record["tensorflow"]
        lines += ["", f"{title} by CPU (s of CPU, processes with TensorFlow)"]
        for name, seconds in sorted(cpu.items(), key=lambda item: -item[1])[:top]:
            lines.append(f"{seconds:8.1f} {count[name]:4d}  {name[:150]}")
    return "\n".join(lines)


def _cpu_times() -> tuple[int, int]:
    """(busy, all) jiffies of every core since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def run(pytest_args: Sequence[str], out: Path) -> tuple[int, list[dict[str, Any]], float]:
    """Runs pytest under the census; returns its exit code, the records and the share of the
    cores that were busy."""
    site = out / "site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(HOOK)
    log = out / "processes.jsonl"
    log.unlink(missing_ok=True)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, LOG_VARIABLE: str(log)}
    before = _cpu_times()
    start = time.monotonic()
    code = subprocess.call([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                            *pytest_args], cwd=ROOT, env=env)
    wall = time.monotonic() - start
    after = _cpu_times()
    busy = (after[0] - before[0]) / max(after[1] - before[1], 1)
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    print(f"[suite_census] {wall:.0f} s; {cpu_description()}")
    return code, records, busy


def main(argv: Sequence[str] | None = None) -> int:
    args_in = list(sys.argv[1:] if argv is None else argv)
    pytest_args = PYTEST_DEFAULT
    if "--" in args_in:
        cut = args_in.index("--")
        args_in, pytest_args = args_in[:cut], args_in[cut + 1:]
    parser = argparse.ArgumentParser(prog="python -m bench.suite_census",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, help="folder for the log (default: a temporary one)")
    parser.add_argument("--top", type=int, default=20, help="rows in each table")
    args = parser.parse_args(args_in)
    with tempfile.TemporaryDirectory() as tmp:
        code, records, busy = run(pytest_args, args.out or Path(tmp))
    print(summarize(records, args.top, busy))
    return code


if __name__ == "__main__":
    sys.exit(main())
