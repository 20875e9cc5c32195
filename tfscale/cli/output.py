"""What a command does when the reader of its output goes away (``| head``, a closed ``tee``).

Python ignores SIGPIPE, so a write into a pipe that nobody reads any more raises
``BrokenPipeError``; left alone, that ends a command with a traceback and exit code 1, or hangs
a launcher whose output thread died while its workers' pipes fill up. Two rules:

- **A run's output is not its work** (:func:`divert_when_reader_leaves`): ``tfscale.train``
  (each process, the ``--num_processes`` launcher included), ``tfscale.sweep`` and
  ``tfscale-run`` keep going. The broken stream's file descriptor is pointed at the run's own
  log (``MODEL_DIR/train.log``, ``OUT/sweep.log``; ``tfscale-run`` has none and discards), one
  line on stderr says so, and the run ends as it would have: checkpoint, results, exit code.
  Before the run's folder is known (:func:`hold_when_reader_leaves`) the output is kept and
  moved into the log once it is.
- **A listing's output is its product** (:func:`ends_quietly`): help, ``--list``,
  ``tfscale.predict``, ``tfscale.sweep --dry_run`` stop at the first line they cannot write,
  silently, with exit code 0, as ``ls | head`` does (without ``pipefail``'s 141: the reader
  took what it wanted).
"""

from __future__ import annotations

import functools
import io
import os
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, ParamSpec

P = ParamSpec("P")

class _Descriptor(io.RawIOBase):
    """Writes to file descriptor ``fd``; the first write that finds its reader gone points
    ``fd`` at the log (``divert``) and is written there."""

    def __init__(self, fd: int, divert: Callable[[int], None]) -> None:
        super().__init__()
        self._fd = fd
        self._divert = divert

    def writable(self) -> bool:
        return True

    def fileno(self) -> int:
        return self._fd

    def isatty(self) -> bool:
        return os.isatty(self._fd)

    def write(self, data: Any) -> int:
        try:
            return os.write(self._fd, data)
        except BrokenPipeError:
            self._divert(self._fd)
            return os.write(self._fd, data)


def _is_pipe(stream: io.TextIOWrapper) -> bool:
    try:
        mode = os.fstat(stream.fileno()).st_mode
    except (OSError, ValueError):  # closed, or over no file descriptor
        return False
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode)


def _rebuilt(stream: io.TextIOWrapper, divert: Callable[[int], None]) -> io.TextIOWrapper:
    """A text stream like ``stream`` (encoding, errors, buffering) over a :class:`_Descriptor`
    of its file descriptor."""
    stream.flush()
    raw = _Descriptor(stream.fileno(), divert)
    binary = raw if isinstance(stream.buffer, io.RawIOBase) else io.BufferedWriter(raw)
    # typeshed's _WrappedBuffer is narrower than what TextIOWrapper takes (raw or buffered).
    return io.TextIOWrapper(binary, encoding=stream.encoding,  # type: ignore[arg-type]
                            errors=stream.errors,
                            line_buffering=stream.line_buffering,
                            write_through=stream.write_through)


class _Diversion:
    """Where this process's streams go once their reader has gone: one target for stdout and
    stderr, set by :func:`divert_when_reader_leaves` and :func:`hold_when_reader_leaves`."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.program = ""
        self.log: Path | None = None
        self.holding = False  # the log is not known yet
        self.held: IO[bytes] | None = None  # what was written while holding
        self.diverted: list[int] = []  # file descriptors pointed away from their pipe
        self.announced = False
        self.installed: set[str] = set()

    def divert(self, fd: int) -> None:
        """Points ``fd``, whose reader has gone, at the target."""
        with self.lock:
            if fd in self.diverted:  # another thread's write found the same broken pipe first
                return
            self.diverted.append(fd)
            self._point([fd])

    def retarget(self, program: str, log: Path | None, holding: bool) -> None:
        """Sets the target; the streams already diverted go there from now on."""
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()  # what is buffered goes where it was written for
            except (OSError, ValueError):
                pass
        with self.lock:
            self.program, self.log, self.holding = program, log, holding
            if self.diverted:
                self._point(list(self.diverted))

    def _point(self, fds: list[int]) -> None:
        """Points ``fds`` at the target (with the lock held); once it is final, says so."""
        names = " and ".join(_NAMES.get(fd, f"file descriptor {fd}") for fd in fds)
        if self.holding:
            if self.held is None:
                self.held = tempfile.TemporaryFile()
            target = os.dup(self.held.fileno())
        else:
            target = _open_log(self.log)
            if self.log is not None:
                _write_quietly(target, f"[{self.program}, pid {os.getpid()}, "
                               f"{time.strftime('%Y-%m-%d %H:%M:%S')}] {names} "
                               f"continue{'s' if len(fds) == 1 else ''} here: its reader "
                               "closed the pipe\n".encode())
            if self.held is not None:
                self.held.seek(0)
                while chunk := self.held.read(1 << 16):
                    _write_quietly(target, chunk)
                self.held.close()
                self.held = None
        for fd in fds:
            os.dup2(target, fd)
        os.close(target)
        if self.holding or self.announced:
            return
        self.announced = True
        went = f"its output goes to {self.log}" if self.log else "its output is discarded"
        _write_quietly(2, f"{self.program}: the reader of {names} has gone (broken pipe); the "
                       f"run goes on and {went}\n".encode())

    def install(self) -> None:
        """Puts stdout and stderr, where they are pipes, over :class:`_Descriptor` s."""
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if (name not in self.installed and isinstance(stream, io.TextIOWrapper)
                    and _is_pipe(stream)):
                setattr(sys, name, _rebuilt(stream, self.divert))
                self.installed.add(name)


_NAMES = {1: "stdout", 2: "stderr"}
_diversion = _Diversion()


def divert_when_reader_leaves(log: Path | None, program: str) -> None:
    """From now on, when the reader of stdout or stderr goes away, this process writes that
    stream to ``log`` (appended; created with its folder) instead, or discards it when ``log``
    is None, and goes on; it says so once on stderr (if stderr is gone too, only in ``log``).
    Called again, e.g. once the run's folder is known, it names the new log: what was held
    (:func:`hold_when_reader_leaves`) is moved there first.

    Only a pipe or socket can lose its reader: a stream that is a terminal or a file, or not a
    file at all, is left as it is. File descriptors are redirected (``dup2``), so output written
    below Python (TensorFlow's) and by child processes started later goes to ``log`` too.

    Args:
        log: the run's own log, e.g. ``MODEL_DIR/train.log``; None to discard.
        program: the command, named in the notice (``tfscale.train``).
    """
    _diversion.retarget(program, log, holding=False)
    _diversion.install()


def hold_when_reader_leaves(program: str) -> None:
    """:func:`divert_when_reader_leaves` before the log is known: what is written after the
    reader left is kept (in a temporary file) until it names the log, then moved into it."""
    _diversion.retarget(program, None, holding=True)
    _diversion.install()


def _open_log(log: Path | None) -> int:
    if log is not None:
        try:
            log.parent.mkdir(parents=True, exist_ok=True)
            return os.open(log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        except OSError:
            pass  # an unwritable log must not stop the run either
    return os.open(os.devnull, os.O_WRONLY)


def _write_quietly(fd: int, data: bytes) -> None:
    try:
        os.write(fd, data)
    except OSError:
        pass  # stderr is gone too: the run goes on without the notice


def silence_stdout() -> None:
    """Points stdout at /dev/null, so that nothing more goes to a pipe whose reader has gone
    (Python's own flush at exit included, which would otherwise end in exit code 120)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, io.UnsupportedOperation):
        pass  # stdout is not a file: nothing to silence
    finally:
        os.close(devnull)


def ends_quietly(main: Callable[P, int]) -> Callable[P, int]:
    """``main`` of a command whose output is its product: when the reader of its stdout goes
    away, it stops there and returns 0 instead of raising ``BrokenPipeError``."""

    @functools.wraps(main)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> int:
        try:
            code = main(*args, **kwargs)
            sys.stdout.flush()  # what is still buffered fails here, not at exit
        except BrokenPipeError:
            silence_stdout()
            return 0
        except SystemExit:
            # argparse's --help writes (ignoring a broken pipe) and exits: Python's own flush
            # at exit would fail with exit code 120.
            try:
                sys.stdout.flush()
            except BrokenPipeError:
                silence_stdout()
            raise
        return code

    return wrapper
