"""The batch system's warning signal (SIGUSR1), caught from the start of a training process.

Slurm (``--signal=USR1@150``) and tfscale's own launchers send SIGUSR1 some time before they
end a job. Once training runs, :class:`tfscale.callbacks.TrainingGuard` handles it: every
worker checkpoints at an agreed step and exits 75, and the job script requeues the job. Before
that, while TensorFlow loads, the data is staged or the workers find each other (seconds to
minutes), SIGUSR1's default action would end the process with no checkpoint and an exit status
that no job script takes for a preemption. :func:`catch_warning` records the signal instead;
the guard then stops at the first step, which writes the checkpoint the requeued job resumes
from. SIGTERM keeps its default action until training begins: it is how launchers stop a
worker that hangs in start-up.

This module imports no TensorFlow, so the entry point can install the handler first.
"""

from __future__ import annotations

import signal
from types import FrameType

_received = 0


def _record(signum: int, frame: FrameType | None) -> None:
    global _received
    _received = signum


def catch_warning() -> None:
    """Records SIGUSR1 from now on, until the training guard takes it over."""
    signal.signal(signal.SIGUSR1, _record)


def warned() -> int:
    """The signal number received before training began (0: none)."""
    return _received
