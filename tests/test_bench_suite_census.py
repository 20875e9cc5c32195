"""bench.suite_census: the processes a pytest run starts, by test and by command."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from bench.suite_census import ACCT_V3, account, command_of, owning_test, read_accounting, summarize
from tests.conftest import ROOT

SPAWNING = '''
import os, subprocess, sys

def test_spawns_three():
    for code in ("pass", "import os; os._exit(0)"):
        subprocess.run([sys.executable, "-c", code], check=True)
    # A test's own PYTHONPATH replaces the census's (as run_process(env=...) does).
    subprocess.run([sys.executable, "-c", "pass"], check=True,
                   env={**os.environ, "PYTHONPATH": os.getcwd()})

def test_spawns_none():
    pass
'''


def test_a_census_logs_each_process_under_its_test(tmp_path: Path) -> None:
    """The three children are logged under the test that started them: the one ending
    through os._exit too, and the one whose PYTHONPATH its test replaced (the hook's .pth
    file); the pytest process itself under "(pytest workers)". No .pth file is left."""
    site_packages = Path(sysconfig.get_paths()["purelib"])
    before = sorted(site_packages.glob("tfscale_suite_census_*.pth"))
    (tmp_path / "test_spawning.py").write_text(SPAWNING)
    out = tmp_path / "census"
    proc = subprocess.run([sys.executable, "-m", "bench.suite_census", "--out", str(out), "--",
                           "-q", str(tmp_path / "test_spawning.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout
    logged = [json.loads(line) for line in (out / "processes.jsonl").read_text().splitlines()]
    records = [r for r in logged if r.get("event") != "start"]
    # Each process logged its start too, with the same pid and start time as its exit.
    assert sorted((r["pid"], r["start"]) for r in logged if r.get("event") == "start") == sorted(
        (r["pid"], r["start"]) for r in records)
    tests = sorted(owning_test(r) for r in records)
    assert tests[0] == "(pytest workers)", tests
    assert [t.endswith("test_spawning.py::test_spawns_three") for t in tests[1:]] == [True] * 3
    assert not any(r["tensorflow"] for r in records)
    assert "4 Python processes logged" in proc.stdout and "0 loaded TensorFlow" in proc.stdout
    assert sorted(site_packages.glob("tfscale_suite_census_*.pth")) == before


def test_the_summary_ranks_tests_and_commands_by_cpu() -> None:
    records = [
        {"test": "tests/a.py::t1 (call)", "argv": "-m tfscale.train --x", "tensorflow": True,
         "cpu_s": 4.0},
        {"test": "tests/a.py::t1 (call)", "argv": "-m tfscale.train --y", "tensorflow": True,
         "cpu_s": 3.0},
        {"test": "tests/b.py::t2 (setup)", "argv": "-c /tmp/x/model.keras",
         "tensorflow": False, "cpu_s": 0.5},
        {"test": "", "argv": "-c import sys", "tensorflow": True, "cpu_s": 20.0},
    ]
    assert command_of(records[2]) == "-c"
    text = summarize(records, top=2, busy=0.96)
    assert text.splitlines()[:2] == [
        "cores busy: 96.0% of the run's wall time",
        "4 Python processes logged, 28 s of CPU; 3 loaded TensorFlow, 27 s of CPU"]
    tests = text.split("tests by CPU")[1].split("\n\n")[0].splitlines()[1:]
    assert [line.split() for line in tests] == [["20.0", "1", "(pytest", "workers)"],
                                                ["7.0", "2", "tests/a.py::t1"]]
    commands = text.split("commands by CPU")[1].splitlines()[1:]
    assert [line.split() for line in commands] == [["20.0", "1", "-c", "import"],
                                                   ["7.0", "2", "-m", "tfscale.train"]]


KILLED = '''
import os, signal, subprocess, sys

def test_kills_one():
    child = subprocess.Popen([sys.executable, "-c", "sum(range(3 * 10**7)); print('ready', "
                              "flush=True); import time; time.sleep(120)"],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline() == "ready\\n"
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    subprocess.run(["sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done"],
                   check=True)
'''


@pytest.mark.skipif(os.geteuid() != 0, reason="kernel process accounting (acct) needs root")
def test_accounting_counts_a_killed_child_under_its_test_and_sees_the_shell(
        tmp_path: Path) -> None:
    """A child killed by SIGKILL logs no exit; with --accounting its CPU (it summed 3e7
    numbers first) is counted under its test, and the shell's loop appears among the processes
    the census itself did not see.

    The census runs in a PID namespace of its own: acct(2) is per namespace, so it leaves the
    accounting of a census that runs this suite (and of any system service) on."""
    (tmp_path / "test_killing.py").write_text(KILLED)
    out = tmp_path / "census"
    proc = subprocess.run(["unshare", "--pid", "--fork", "--kill-child", sys.executable, "-m",
                           "bench.suite_census", "--out", str(out), "--accounting", "--", "-q",
                           str(tmp_path / "test_killing.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    text = proc.stdout
    killed = re.search(r"killed by a signal\): 1, (\d+\.\d) s of CPU", text)
    assert killed, text
    census = [json.loads(line) for line in (out / "processes.jsonl").read_text().splitlines()]
    child = next(r for r in census if r.get("event") == "start" and "sum(range" in r["argv"])
    assert not any(r["pid"] == child["pid"] and "cpu_s" in r for r in census)
    kernel = [r for r in read_accounting(out / "pacct") if r["pid"] == child["pid"]]
    assert len(kernel) == 1 and kernel[0]["cpu_s"] > 0.1, kernel
    tests = text.split("tests by CPU")[1].split("\n\n")[0]
    row = next(line for line in tests.splitlines() if line.endswith("::test_kills_one"))
    assert float(row.split()[0]) >= kernel[0]["cpu_s"] - 0.05  # the table rounds to 0.1 s
    seen = text.split("did not see")[1].splitlines()[0]
    assert re.search(r"\bsh \d+\.\d s", seen), seen


def test_accounting_records_are_read_and_joined_by_pid_and_start(tmp_path: Path) -> None:
    def record(pid: int, start: int, utime: int, comm: bytes) -> bytes:
        return ACCT_V3.pack(0, 3, 0, 0, 0, 0, pid, 1, start, 0.0, utime, 0, 0, 0, 0, 0, 0, 0,
                            comm)

    # comp_t: 13-bit mantissa, base-8 exponent: (1 << 13) | 5 is 5 * 8 = 40 ticks, 0.4 s.
    path = tmp_path / "pacct"
    path.write_bytes(record(7, 1000, (1 << 13) | 5, b"python")
                     + record(7, 1500, 30, b"python")  # pid 7 reused later
                     + record(9, 1000, 250, b"sh"))
    kernel = read_accounting(path)
    assert [(k["pid"], k["cpu_s"], k["comm"]) for k in kernel] == [
        (7, 0.4, "python"), (7, 0.3, "python"), (9, 2.5, "sh")]
    census = [{"event": "start", "pid": 7, "start": 1500.4, "test": "t::b (call)", "argv": "-c"},
              {"event": "start", "pid": 7, "start": 999.9, "test": "t::a (call)", "argv": "-c"},
              {"pid": 7, "start": 999.9, "test": "t::a (call)", "argv": "-c",
               "tensorflow": True, "cpu_s": 0.39}]
    records, lines = account(census, kernel)
    assert [(r["test"], r["cpu_s"], bool(r.get("unlogged"))) for r in records] == [
        ("t::a (call)", 0.39, False), ("t::b (call)", 0.3, True)]
    assert "killed by a signal): 1, 0.3 s of CPU" in lines[0]
    assert lines[1].endswith(": 1, 2.5 s of CPU; most: sh 2.5 s")
    text = summarize(records, accounted=lines)
    assert "2 Python processes" not in text and "1 Python processes logged" in text
    assert [line.split()[:2] for line in text.split("tests by CPU")[1].splitlines()[1:3]] == [
        ["0.4", "1"], ["0.3", "0"]]
    path.write_bytes(record(7, 1000, 1, b"x")[:50])
    with pytest.raises(ValueError, match="pacct: 50 bytes is not a whole number"):
        read_accounting(path)
