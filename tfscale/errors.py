"""Exit codes of ``python -m tfscale.train`` and the error that carries them.

| code | meaning |
|------|---------|
| 0    | trained to the last step |
| 1    | unexpected error (traceback printed) |
| 2    | bad configuration or input, reported before training (one line) |
| 3    | the loss became NaN/Inf; the last good checkpoint is kept |
| 4    | a peer worker was lost or stalled |
| 75   | preempted (SIGTERM/SIGUSR1): checkpoint written, run the same command to resume |

``--help``, ``--helpshort`` and ``--helpfull`` exit 0; absl's own flag errors (an unknown or
misspelt flag, a bad value, a missing ``--flagfile``) are bad usage like any other: one line,
exit 2 (:func:`parse_flags`). So do the usage errors of tfscale's API for your own script
(``tfscale.setup: ...``) that the script leaves uncaught (:func:`report_script_usage_errors`).

A reader of the output that goes away (``| head``, a closed pipe) changes no exit code
(:mod:`tfscale.output`): a training run goes on to its end, its output appended to
``MODEL_DIR/train.log`` from there (one line on stderr says so), and exits as it would have;
help and ``--list`` stop quietly with 0.
"""

from __future__ import annotations

import re
import sys
from types import TracebackType

from absl import flags as absl_flags

from tfscale.output import silence_stdout

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
    r"shared-memory exchange", re.IGNORECASE)
_TASK = re.compile(r"/job:worker/replica:\d+/task:(\d+)|shared-memory exchange: rank\(s\) \[(\d+)")


def parse_flags(argv: list[str],
                flag_values: absl_flags.FlagValues = absl_flags.FLAGS) -> list[str]:
    """absl's ``app.run(main, flags_parser=parse_flags)``: parses ``argv`` into
    ``flag_values`` and returns the arguments that are not flags. absl itself exits 1 both
    for help and for a flag error, the latter with a two-line ``FATAL Flags parsing error``.

    Raises:
        SystemExit: 0 after absl printed the help (also when the help's reader went away
            before the end: ``--helpfull | head``); 2 after one ``error: ...`` line for a flag
            error (absl's suggestion, ``Did you mean: model, model_dir?``, kept).
    """
    try:
        return flag_values(argv)
    except absl_flags.Error as err:
        print(f"error: {flag_error(err)}", file=sys.stderr, flush=True)
        raise SystemExit(EXIT_USAGE) from None
    except SystemExit as stop:
        # absl's help flags print the help and exit 1; asking for help is not an error.
        code = EXIT_OK if stop.code == EXIT_ERROR else stop.code
        try:
            sys.stdout.flush()
        except BrokenPipeError:
            silence_stdout()
        raise SystemExit(code) from None
    except BrokenPipeError:
        silence_stdout()
        raise SystemExit(EXIT_OK) from None


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


def flag_error(err: absl_flags.Error) -> str:
    """absl's message for a flag error on one line, without its ``ERROR::`` prefix."""
    return " ".join(str(err).removeprefix("ERROR:: ").split()).replace(" ?", "?")


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
