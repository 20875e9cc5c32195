"""bench.suite_census: the processes a pytest run starts, by test and by command."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from bench.suite_census import command_of, owning_test, summarize
from tests.conftest import ROOT

SPAWNING = '''
import subprocess, sys

def test_spawns_two():
    for code in ("pass", "import os; os._exit(0)"):
        subprocess.run([sys.executable, "-c", code], check=True)

def test_spawns_none():
    pass
'''


def test_a_census_logs_each_process_under_its_test(tmp_path: Path) -> None:
    """Both children are logged under the test that started them, the one ending through
    os._exit too; the pytest process itself under "(pytest workers)"."""
    (tmp_path / "test_spawning.py").write_text(SPAWNING)
    out = tmp_path / "census"
    proc = subprocess.run([sys.executable, "-m", "bench.suite_census", "--out", str(out), "--",
                           "-q", str(tmp_path / "test_spawning.py")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "2 passed" in proc.stdout
    records = [json.loads(line) for line in (out / "processes.jsonl").read_text().splitlines()]
    tests = sorted(owning_test(r) for r in records)
    assert tests[0] == "(pytest workers)", tests
    assert [t.endswith("test_spawning.py::test_spawns_two") for t in tests[1:]] == [True, True]
    assert not any(r["tensorflow"] for r in records)
    assert "3 Python processes logged" in proc.stdout and "0 loaded TensorFlow" in proc.stdout


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
