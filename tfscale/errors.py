"""Exit codes of ``python -m tfscale.train`` and the error that carries them.

| code | meaning |
|------|---------|
| 0    | trained to the last step |
| 1    | unexpected error (traceback printed) |
| 2    | bad configuration or input, reported before training (one line) |
| 3    | the loss became NaN/Inf; the last good checkpoint is kept |
| 4    | a peer worker was lost or stalled |
| 75   | preempted (SIGTERM/SIGUSR1): checkpoint written, run the same command to resume |
"""

from __future__ import annotations

import re

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
