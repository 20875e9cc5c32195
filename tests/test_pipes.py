"""Output into a pipe whose reader goes away (``| head``), with real pipes (tfscale.cli.output).

A training run goes on to its end, its output appended to ``MODEL_DIR/train.log``; the
``--num_processes`` launcher keeps reading its workers, so the chief never blocks on a full
pipe, and SIGTERM still ends the run at a checkpoint (75). Listing and help commands stop
quietly with exit code 0.

Mid-run events are made certain, not raced: the pipe holds one page (``F_SETPIPE_SZ``) and
the test reads its lines byte by byte (or none), so a writer can be at most a page ahead of
what the test has read; each run writes well over a page more than that, so its reader is gone
while it runs. Every process runs in its own session, bounded by a timeout, its group killed after.
"""

from __future__ import annotations

import fcntl
import io
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY, read_results, requires_horovod
from tests.faults import kill_group, progress, wait_for
from tfscale.scripts.launcher import _pump

TRAIN = [sys.executable, "-m", "tfscale.train"]
NOTICE = "the reader of stdout has gone (broken pipe); the run goes on"
PAGE = 4096


@contextmanager
def piped(command: list[str], stderr: Path) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    """Starts ``command`` with its stdout into a one-page pipe; yields the process and the
    pipe's read end (closed on exit, if the test has not closed it), then kills the group."""
    read, write = os.pipe()
    fcntl.fcntl(write, fcntl.F_SETPIPE_SZ, PAGE)
    assert fcntl.fcntl(write, fcntl.F_GETPIPE_SZ) == PAGE
    with open(stderr, "wb") as err:
        # Python's default buffering, as in a user's shell.
        env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}
        proc = subprocess.Popen(command, cwd=ROOT, stdout=write, stderr=err, env=env,
                                start_new_session=True)
    os.close(write)
    try:
        yield proc, read
    finally:
        kill_group(proc)
        try:
            os.close(read)
        except OSError:
            pass


def read_lines(fd: int, count: int) -> list[str]:
    """The next ``count`` lines of ``fd``, read a byte at a time (nothing more is consumed)."""
    data = b""
    while data.count(b"\n") < count:
        byte = os.read(fd, 1)
        assert byte, f"the output ended after {data!r}"
        data += byte
    return data.decode().splitlines()


def wait(proc: subprocess.Popen[bytes], timeout: float, stderr: Path) -> int:
    try:
        return proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_group(proc)
        pytest.fail(f"hung: no exit within {timeout} s\n{stderr.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def one_process(tmp_path_factory: pytest.TempPathFactory) -> dict[str, object]:
    """``python -m tfscale.train ... | head -0`` in one process, on 160 PNGs in class folders
    (a run on real data exports a model, which the predict test reads): the reader is gone
    before the first line, which may come while the config is built (what the data holds),
    before the run's folder is known."""
    from PIL import Image

    root = tmp_path_factory.mktemp("one")
    for c in range(4):
        (root / "images" / "train" / f"c{c}").mkdir(parents=True)
        for i in range(40):
            pixels = bytes((c * 60 + i * 7 + j) % 256 for j in range(16 * 16 * 3))
            Image.frombytes("RGB", (16, 16), pixels).save(
                root / "images" / "train" / f"c{c}" / f"{i}.png")
    model_dir, stderr = root / "run", root / "stderr"
    command = [*TRAIN, *TINY, "--steps=120", "--dataset=image_folder",
               f"--data_dir={root / 'images'}", f"--model_dir={model_dir}"]
    with piped(command, stderr) as (proc, read):
        os.close(read)
        code = wait(proc, 180, stderr)
    return {"code": code, "model_dir": model_dir, "images": root / "images",
            "stderr": stderr.read_text()}


def test_one_process_whose_reader_leaves_trains_to_the_end(one_process: dict[str, object]
                                                          ) -> None:
    model_dir, err = one_process["model_dir"], one_process["stderr"]
    assert isinstance(model_dir, Path) and isinstance(err, str)
    assert one_process["code"] == 0, err[-3000:]
    assert "Traceback" not in err and err.count(NOTICE) == 1, err[-3000:]
    assert f"its output goes to {model_dir / 'train.log'}" in err
    # Nothing of the run is lost: its last step's checkpoint, results and export.
    assert read_results(model_dir)["steps"] == 120
    assert (model_dir / "checkpoints" / "ckpt-000000120.npz").is_file()
    assert (model_dir / "export" / "inference.json").is_file()
    # All of its output, from the first line on.
    log = (model_dir / "train.log").read_text()
    assert log.startswith("[tfscale.train, pid ") and "stdout continues here" in log
    assert "--model=tiny_cnn on --dataset=image_folder" in log
    assert "step 1/120" in log and "step 120/120" in log and "training time" in log


HOLD = """
import sys
from pathlib import Path
from tfscale.cli import output
output.hold_when_reader_leaves("probe")
print("before the log is known", flush=True)
print("to stderr", file=sys.stderr, flush=True)
output.divert_when_reader_leaves(Path(sys.argv[1]), "probe")
print("after", flush=True)
"""


def test_output_before_the_log_is_known_is_kept_for_it(tmp_path: Path) -> None:
    log = tmp_path / "run" / "train.log"
    with piped([sys.executable, "-c", HOLD, str(log)], tmp_path / "stderr") as (proc, read):
        os.close(read)
        code = wait(proc, 60, tmp_path / "stderr")
    err = (tmp_path / "stderr").read_text()
    assert code == 0, err
    assert err == ("to stderr\nprobe: the reader of stdout has gone (broken pipe); the run goes "
                   f"on and its output goes to {log}\n")
    lines = log.read_text().splitlines()
    assert lines[0].startswith("[probe, pid ") and lines[1:] == ["before the log is known",
                                                                  "after"]


def test_predict_stops_quietly_when_its_reader_leaves(one_process: dict[str, object],
                                                      tmp_path: Path) -> None:
    # 160 lines of ~60 bytes: the reader leaves after three, more than a page before the end.
    command = [sys.executable, "-m", "tfscale.predict", f"--model_dir={one_process['model_dir']}",
               "--batch_size=8", str(one_process["images"])]
    with piped(command, tmp_path / "stderr") as (proc, read):
        head = read_lines(read, 3)
        os.close(read)
        code = wait(proc, 120, tmp_path / "stderr")
    err = (tmp_path / "stderr").read_text()
    assert code == 0, err[-3000:]
    assert "Traceback" not in err and "BrokenPipe" not in err, err[-3000:]
    assert head[0].split()[0].endswith("c0/0.png")


@pytest.mark.parametrize("argv", [
    ["tfscale.train", "--list"],
    ["tfscale.train", "--helpfull"],
    ["tfscale.sweep", "--help"],
    ["tfscale.sweep", "--dry_run", "--grid=batch_size=8,16", "--", "--model=mlp"],
    ["tfscale.predict", "--help"],
    ["tfscale.run", "--help"],  # argparse's
    ["tfscale.forecast", "--machine=summit", "--nodes=1,8"],
    ["launch.jobscript", "slurm", "--nodes=2", "--", "--model=mlp", "--strategy=horovod"],
])
def test_listing_and_help_end_quietly_when_the_reader_is_gone(argv: list[str],
                                                              tmp_path: Path) -> None:
    command = [sys.executable, "-m", *argv]
    with piped(command, tmp_path / "stderr") as (proc, read):
        os.close(read)  # the reader left before the first line (| head -0, a closed pipe)
        code = wait(proc, 60, tmp_path / "stderr")
    assert code == 0, (tmp_path / "stderr").read_text()
    assert (tmp_path / "stderr").read_text() == ""
    # It does write to stdout when someone reads it.
    shown = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and shown.stdout.strip(), shown.stderr


def test_cluster_status_into_a_closed_pipe_keeps_its_exit_code(tmp_path: Path) -> None:
    """``python -m launch.minicluster status | head`` ends without a traceback, and its exit
    code still says up (0) or down (1), as when its output is read."""
    command = [sys.executable, "-m", "launch.minicluster", "status"]
    shown = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert shown.returncode in (0, 1) and shown.stdout.strip(), shown.stderr
    with piped(command, tmp_path / "stderr") as (proc, read):
        os.close(read)
        code = wait(proc, 60, tmp_path / "stderr")
    assert (tmp_path / "stderr").read_text() == ""
    # The cluster's state is another test's business (it may come up or go down meanwhile):
    # the code is one of the two, not Python's 120 for a failed flush at exit.
    assert code in (0, 1)


@pytest.mark.slow
@requires_horovod
def test_launcher_whose_reader_leaves_keeps_its_workers_going_and_stops_at_a_checkpoint(
        tmp_path: Path) -> None:
    model_dir, stderr = tmp_path / "run", tmp_path / "stderr"
    command = [*TRAIN, *TINY, "--strategy=horovod", "--num_processes=2", "--steps=100000",
               f"--model_dir={model_dir}"]
    log = model_dir / "train.log"
    with piped(command, stderr) as (launcher, read):
        head = read_lines(read, 3)
        os.close(read)
        # Before the fix the launcher's output thread died here and the chief blocked once
        # its pipe (64 kB, ~400 lines) was full. 1,000 more steps: it did not.
        wait_for(progress(log, 1000), 120, "step 1000 in train.log")
        launcher.send_signal(signal.SIGTERM)
        code = wait(launcher, 120, stderr)
    err = stderr.read_text()
    assert code == 75, err[-3000:]
    assert err.count(NOTICE) == 1 and f"its output goes to {log}" in err, err[-3000:]
    assert all(line.startswith(("[0] ", "[1] ")) for line in head), head
    text = log.read_text()
    assert "[0] error: preempted by a signal at step" in text
    # The checkpoint of the step it stopped at, and the lock released.
    step = int(text.split("preempted by a signal at step ")[1].split(";")[0])
    assert step >= 1000 and (model_dir / "checkpoints" / f"ckpt-{step:09d}.npz").is_file()
    assert not (model_dir / "run.lock").exists()


class _FullDisk(io.StringIO):
    def write(self, text: str) -> int:
        raise OSError(28, "No space left on device")


def test_launcher_keeps_reading_a_worker_whose_lines_it_cannot_write() -> None:
    worker = io.StringIO("".join(f"line {i}\n" for i in range(1000)))
    _pump(0, worker, _FullDisk())
    assert worker.read() == "", "the worker's output was not read to the end"
