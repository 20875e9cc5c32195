"""Where the test suite's CPU goes: every Python process a pytest run starts, by test.

    python -m bench.suite_census [--out DIR] [--top N] [--accounting] [-- PYTEST_ARGS ...]

Runs ``python -m pytest PYTEST_ARGS`` (default: the README's ``-n 2 --dist loadfile`` over
``tests/``) with a ``sitecustomize`` on the ``PYTHONPATH`` that logs, when each Python process
ends, its test (``PYTEST_CURRENT_TEST``, which child processes inherit), its command, whether it
had loaded TensorFlow, and its CPU seconds (user + system). The report says how busy the
machine's cores were, how many processes loaded TensorFlow and what they cost, and which tests
and commands spent the most. Most of the suite's CPU goes to TensorFlow's start-up (3-4 s of
CPU per process on an AMD EPYC Zen 4, 4.4-6.1 s on an AVX2-only one), so the number of TensorFlow
processes per test is what a cut of CI time has to reduce.

The hook is also in a ``.pth`` file in the interpreter's ``site-packages`` for the run, so it
runs in the processes whose test replaces ``PYTHONPATH`` (``run_process(env=...)``) as well; it
logs only where the census's variable is in the environment, so it is inert outside the run
and removed after it. Processes killed by a signal run no exit hook, and processes started
with an environment that drops the census's variable (sshd's and ``orted``'s) none at all;
shells, Slurm's and MPI's daemons are not Python. With ``--accounting`` (root) the kernel's
process accounting (acct(2)) records every process of the run: the killed ones' CPU is then
counted under the test their start record names, and the report says what the other
processes cost. Accounting goes to the census's own file for the run and is switched off at
the end. acct(2) is per PID namespace: where a system service keeps accounting, run the census
in a namespace of its own (``unshare --pid --fork``; not the mini-cluster's tests, which
signal processes by the pids they read in /proc). The pytest workers' line holds the tests
that run TensorFlow in the worker itself.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import ctypes
import json
import os
import struct
import subprocess
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

from bench.common import ROOT, cpu_description

LOG_VARIABLE = "TFSCALE_SUITE_CENSUS_LOG"
# Logged as each process starts and again at exit, also through os._exit (worker processes and
# forked children end that way). "start" is the process's own start time (seconds since the
# epoch, from /proc: a forked child's, not its parent's), which with the pid names it among the
# kernel's accounting records; pids are reused within a run.
HOOK = f'''
import os, sys, json, resource

def _tfscale_census_start():
    with open("/proc/self/stat") as stat:
        ticks = int(stat.read().rsplit(")", 1)[1].split()[19])
    with open("/proc/stat") as stat:
        boot = next(int(line.split()[1]) for line in stat if line.startswith("btime "))
    return round(boot + ticks / os.sysconf("SC_CLK_TCK"), 2)

def _tfscale_census_write(record):
    try:
        record.update(pid=os.getpid(), start=_tfscale_census_start(),
                      test=os.environ.get("PYTEST_CURRENT_TEST", ""))
        with open(os.environ["{LOG_VARIABLE}"], "a") as log:
            log.write(json.dumps(record) + "\\n")
    except Exception:
        pass

def _tfscale_census_log():
    usage = resource.getrusage(resource.RUSAGE_SELF)
    _tfscale_census_write({{"argv": " ".join(sys.argv[:3])[:200],
                           "tensorflow": "tensorflow" in sys.modules,
                           "cpu_s": round(usage.ru_utime + usage.ru_stime, 3)}})

if os.environ.get("{LOG_VARIABLE}") and not getattr(sys, "_tfscale_census", False):
    sys._tfscale_census = True  # once, from the .pth file or from sitecustomize
    _tfscale_census_write({{"event": "start", "argv": " ".join(sys.orig_argv[1:4])[:200]}})
    import atexit
    atexit.register(_tfscale_census_log)
    _tfscale_exit = os._exit

    def _census_exit(code):
        _tfscale_census_log()
        _tfscale_exit(code)

    os._exit = _census_exit
'''
# The line of the .pth file: site runs a line that starts with "import" as it starts.
PTH_LINE = (f'import os; os.environ.get("{LOG_VARIABLE}") and '
            f'exec(compile({HOOK!r}, "suite_census", "exec"), {{}})\n')
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
              busy: float | None = None, accounted: Sequence[str] = ()) -> str:
    """The report on a census's records (see the module's text), with ``accounted``'s lines
    (:func:`account`) after the first."""
    records = list(records)
    lines = []
    if busy is not None:
        lines.append(f"cores busy: {busy:.1%} of the run's wall time")
    killed = [r for r in records if r.get("unlogged")]
    records = [r for r in records if not r.get("unlogged")]
    tf = [r for r in records if r["tensorflow"]]
    total = sum(r["cpu_s"] for r in records)
    lines.append(f"{len(records)} Python processes logged, {total:.0f} s of CPU; "
                 f"{len(tf)} loaded TensorFlow, {sum(r['cpu_s'] for r in tf):.0f} s of CPU")
    lines += accounted
    heading = ("s of CPU, processes with TensorFlow" if not killed else
               "s of CPU with the unlogged processes', processes with TensorFlow among the "
               "logged")
    for title, key in (("tests", owning_test), ("commands", command_of)):
        cpu: dict[str, float] = collections.defaultdict(float)
        count: collections.Counter[str] = collections.Counter()
        for record in [*records, *killed]:
            cpu[key(record)] += record["cpu_s"]
            count[key(record)] += bool(record.get("tensorflow"))
        lines += ["", f"{title} by CPU ({heading})"]
        for name, seconds in sorted(cpu.items(), key=lambda item: -item[1])[:top]:
            lines.append(f"{seconds:8.1f} {count[name]:4d}  {name[:150]}")
    return "\n".join(lines)


# The kernel's ``struct acct_v3`` (linux/acct.h), 64 bytes a process: flag, version, tty,
# exitcode, uid, gid, pid, ppid, btime (s since the epoch), etime (float), then eight comp_t
# (utime, stime, mem, io, rw, minflt, majflt, swaps) and the 16-byte command name.
ACCT_V3 = struct.Struct("<BBHIIIIIIf8H16s")
ACCT_HZ = 100  # the unit of its times (AHZ)
START_TOLERANCE_S = 2.0  # btime is whole seconds


def _comp_t(value: int) -> int:
    """acct's 16-bit float: a 13-bit mantissa and a 3-bit base-8 exponent."""
    return (value & 0x1FFF) << (3 * (value >> 13))


def read_accounting(path: Path) -> list[dict[str, Any]]:
    """The process records in an acct(2) file (version 3, as Linux writes them).

    Raises:
        ValueError: naming the file, when it holds a record of another version or a part of
            one.
    """
    data = path.read_bytes()
    if len(data) % ACCT_V3.size:
        raise ValueError(f"{path}: {len(data)} bytes is not a whole number of "
                         f"{ACCT_V3.size}-byte acct_v3 records")
    records = []
    for fields in ACCT_V3.iter_unpack(data):
        if fields[1] != 3:
            raise ValueError(f"{path}: an acct record of version {fields[1]}; expected 3 "
                             "(Linux's acct_v3)")
        records.append({"pid": fields[6], "ppid": fields[7], "start": float(fields[8]),
                        "cpu_s": (_comp_t(fields[10]) + _comp_t(fields[11])) / ACCT_HZ,
                        "comm": fields[18].split(b"\0", 1)[0].decode(errors="replace")})
    return records


@contextlib.contextmanager
def process_accounting(path: Path) -> Iterator[str | None]:
    """Kernel process accounting into ``path`` for the block, switched off after it; yields
    None, or why it could not be switched on (acct(2) needs CAP_SYS_PACCT)."""
    libc = ctypes.CDLL(None, use_errno=True)
    path.touch()
    if libc.acct(str(path).encode()) != 0:
        yield f"acct({path}): {os.strerror(ctypes.get_errno())}"
        return
    try:
        yield None
    finally:
        libc.acct(None)


def account(census: Iterable[dict[str, Any]], accounting: Iterable[dict[str, Any]],
            top: int = 5) -> tuple[list[dict[str, Any]], list[str]]:
    """The census's exit records, plus one (``"unlogged": True``, CPU from ``accounting``) for
    each process that logged its start but not its exit, and the report's lines on what the
    kernel's accounting saw. A census record is an accounting record of the same pid that
    started within START_TOLERANCE_S."""
    by_pid: dict[int, list[dict[str, Any]]] = collections.defaultdict(list)
    for record in accounting:
        by_pid[record["pid"]].append(record)

    def kernel(record: dict[str, Any]) -> dict[str, Any] | None:
        return next((k for k in by_pid.get(record["pid"], ())
                     if abs(k["start"] - record["start"]) <= START_TOLERANCE_S), None)

    census = list(census)
    exits = [r for r in census if r.get("event") != "start"]
    ended = {(r["pid"], r.get("start")) for r in exits}
    matched: set[int] = set()
    unlogged = []
    for record in census:
        found = kernel(record) if "start" in record else None
        if found is not None:
            matched.add(id(found))
        if record.get("event") == "start" and (record["pid"], record["start"]) not in ended \
                and found is not None:
            unlogged.append({**record, "cpu_s": found["cpu_s"], "tensorflow": None,
                             "unlogged": True})
    others = [k for records in by_pid.values() for k in records if id(k) not in matched]
    by_comm: dict[str, float] = collections.defaultdict(float)
    for k in others:
        by_comm[k["comm"]] += k["cpu_s"]
    total = sum(k["cpu_s"] for records in by_pid.values() for k in records)
    lines = [f"kernel accounting: {sum(map(len, by_pid.values()))} processes, {total:.1f} s of "
             f"CPU; Python processes that ended without the exit hook (killed by a signal): "
             f"{len(unlogged)}, {sum(r['cpu_s'] for r in unlogged):.1f} s of CPU, counted "
             f"below under their tests",
             f"processes the census did not see (not Python, or Python without its variable):"
             f" {len(others)}, {sum(by_comm.values()):.1f} s of CPU; most: "
             + ", ".join(f"{comm} {cpu:.1f} s" for comm, cpu in
                         sorted(by_comm.items(), key=lambda item: -item[1])[:top])]
    return exits + unlogged, lines


@contextlib.contextmanager
def hook_in_site_packages() -> Iterator[Path]:
    """The census's hook in a ``.pth`` file of this interpreter's ``site-packages`` for the
    block (a file of its own, so that a census inside a census keeps the outer one's)."""
    fd, name = tempfile.mkstemp(prefix="tfscale_suite_census_", suffix=".pth",
                                dir=sysconfig.get_paths()["purelib"], text=True)
    with os.fdopen(fd, "w") as pth:
        pth.write(PTH_LINE)
    os.chmod(name, 0o644)  # mkstemp's 0600 would hide it from the processes of other users
    try:
        yield Path(name)
    finally:
        os.unlink(name)


def _cpu_times() -> tuple[int, int]:
    """(busy, all) jiffies of every core since boot, from /proc/stat."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n")[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


def run(pytest_args: Sequence[str], out: Path, accounting: bool = False,
        ) -> tuple[int, list[dict[str, Any]], float, list[str]]:
    """Runs pytest under the census (with kernel process accounting where ``accounting``);
    returns its exit code, the records (with the unlogged ones accounting found), the share of
    the cores that were busy and the report's lines on accounting."""
    site = out / "site"
    site.mkdir(parents=True, exist_ok=True)
    (site / "sitecustomize.py").write_text(HOOK)
    log = out / "processes.jsonl"
    log.unlink(missing_ok=True)
    path = os.pathsep.join(p for p in (str(site), os.environ.get("PYTHONPATH", "")) if p)
    env = {**os.environ, "PYTHONPATH": path, LOG_VARIABLE: str(log)}
    pacct = out / "pacct"
    pacct.unlink(missing_ok=True)
    with hook_in_site_packages(), \
            (process_accounting(pacct) if accounting else contextlib.nullcontext()) as refused:
        if refused:
            print(f"[suite_census] no kernel accounting: {refused}", file=sys.stderr)
        before = _cpu_times()
        start = time.monotonic()
        code = subprocess.call([sys.executable, "-m", "pytest", "-p", "no:cacheprovider",
                                *pytest_args], cwd=ROOT, env=env)
        wall = time.monotonic() - start
        after = _cpu_times()
    busy = (after[0] - before[0]) / max(after[1] - before[1], 1)
    records = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    print(f"[suite_census] {wall:.0f} s; {cpu_description()}")
    if accounting and not refused:
        records, lines = account(records, read_accounting(pacct))
        return code, records, busy, lines
    return code, [r for r in records if r.get("event") != "start"], busy, []


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
    parser.add_argument("--accounting", action="store_true",
                        help="also record every process with the kernel's process accounting "
                             "(root): killed processes' CPU and what is not Python")
    args = parser.parse_args(args_in)
    with tempfile.TemporaryDirectory() as tmp:
        code, records, busy, accounted = run(pytest_args, args.out or Path(tmp), args.accounting)
    print(summarize(records, args.top, busy, accounted))
    return code


if __name__ == "__main__":
    sys.exit(main())
