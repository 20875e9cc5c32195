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
