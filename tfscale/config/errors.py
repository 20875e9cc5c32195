"""Exit codes of ``python -m tfscale.train`` and the error that carries them.

| code | meaning |
|------|---------|
| 0    | trained to the last step |
| 1    | unexpected error (traceback printed) |
| 2    | bad configuration or input, reported before training (one line) |
| 3    | the loss became NaN/Inf; the last good checkpoint is kept |
| 4    | a peer worker was lost or stalled |
| 75   | preempted (SIGTERM/SIGUSR1): checkpoint written, run the same command to resume |

A node whose ``/dev/shm`` has no room for the exchange's segment is bad configuration too
(code 2), found at the first step.

``--help``, ``--helpshort`` and ``--helpfull`` exit 0; absl's own flag errors (an unknown or
misspelt flag, a bad value, a missing ``--flagfile``) are bad usage like any other: one line,
exit 2 (:func:`tfscale.cli.command.parse_flags`). So do the usage errors of tfscale's API for your
own script
(``tfscale.setup: ...``) that the script leaves uncaught (:func:`report_script_usage_errors`).

A reader of the output that goes away (``| head``, a closed pipe) changes no exit code
(:mod:`tfscale.cli.output`): a training run goes on to its end, its output appended to
``MODEL_DIR/train.log`` from there (one line on stderr says so), and exits as it would have;
help and ``--list`` stop quietly with 0.
"""

from __future__ import annotations

import re
import sys
from types import TracebackType

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_NON_FINITE = 3
EXIT_PEER_LOST = 4
EXIT_PREEMPTED = 75


class TrainingStopped(Exception):
    """Training ended early for a known reason; ``exit_code`` says which."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


# Messages by which TensorFlow's collectives and Horovod report a lost or stalled peer.
_PEER_FAILURE = re.compile(
    r"Horovod has been shut down|Socket closed|Connection reset by peer|Collective ops is "
    r"aborted|failed to connect|stalled|peer.*(unavailable|not respond)|Gloo|"
    r"shared-memory exchange|cross-node exchange", re.IGNORECASE)
_TASK = re.compile(r"/job:worker/replica:\d+/task:(\d+)"
                   r"|(?:shared-memory|cross-node) exchange: rank\(s\) \[(\d+)")


# tfscale's API for users' scripts names the function in its usage errors (ValueErrors).
_SCRIPT_USAGE = re.compile(r"tfscale\.\w+: ")


def report_script_usage_errors() -> None:
    """From now on, a usage error of tfscale's API that a script does not catch (a
    ``ValueError`` whose message starts with the function's name, ``tfscale.setup: ...``) ends
    the process as bad usage of tfscale's commands does: one ``error: ...`` line on stderr and
    exit code 2, which ``tfscale-run --max_restarts`` does not restart, instead of a traceback
    from every worker. Other exceptions reach the hook that was there before."""
    previous = sys.excepthook
    if getattr(previous, "reports_script_usage_errors", False):
        return

    def hook(kind: type[BaseException], value: BaseException,
             traceback: TracebackType | None) -> None:
        if isinstance(value, ValueError) and _SCRIPT_USAGE.match(str(value)):
            print(f"error: {value}", file=sys.stderr, flush=True)
            # Raised by the hook, SystemExit sets the exit code (atexit handlers still run).
            raise SystemExit(EXIT_USAGE)
        previous(kind, value, traceback)

    hook.reports_script_usage_errors = True  # type: ignore[attr-defined]
    sys.excepthook = hook


# A usage error raised in Python inside a TensorFlow op (``tf.numpy_function``), which TensorFlow
# reports as its own error with the Python one's name and message in its text.
_WRAPPED_USAGE = re.compile(r"^(?:\w+\.)*(SharedMemoryFull): (.+)$", re.MULTILINE)


def describe_wrapped_usage_error(err: BaseException) -> str | None:
    """The message of a usage error that ``err`` (a TensorFlow error) carries from Python code
    run inside an op, such as a ``/dev/shm`` too small for the exchange, else None."""
    found = _WRAPPED_USAGE.search(str(err))
    return found.group(2).strip() if found else None


def describe_peer_failure(err: BaseException) -> str | None:
    """A one-line account of ``err`` when it means a peer worker died or stalled, else None."""
    text = str(err)
    if not _PEER_FAILURE.search(text):
        return None
    task = _TASK.search(text)
    who = f"worker {task.group(1) or task.group(2)}" if task else "a peer worker"
    first = next((line.strip() for line in text.splitlines() if _PEER_FAILURE.search(line)),
                 text.strip().splitlines()[0] if text.strip() else type(err).__name__)
    return f"lost contact with {who} (it died, stalled or was stopped): {first[:300]}"
