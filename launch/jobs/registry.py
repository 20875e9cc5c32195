"""The job-script generators, by launcher name.

A generator is a function ``JobRequest -> str`` (the script) registered under its launcher's
name with a one-line description and the request defaults of its kind of machine (a Summit-style
LSF node has 6 GPUs and 42 cores). Asking for an unknown launcher lists the known ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from launch.jobs.spec import JobRequest
from tfscale.registry import Registry

Generator = Callable[[JobRequest], str]
GENERATORS: Registry[Generator] = Registry("launcher")


def register(name: str, description: str, **defaults: Any) -> Callable[[Generator], Generator]:
    """Registers a generator; ``defaults`` are JobRequest fields for this launcher."""
    return GENERATORS.register(name, description, defaults=defaults)


def request(launcher: str, **fields: Any) -> JobRequest:
    """A validated JobRequest for ``launcher``: its defaults, overridden by ``fields``.

    Raises:
        UnknownNameError: for an unknown launcher (listing the known ones).
        ValueError: for an impossible request.
    """
    defaults = GENERATORS.entry(launcher).meta["defaults"]
    return JobRequest(launcher=launcher, **{**defaults, **fields})


def render(req: JobRequest) -> str:
    """The job script for ``req`` (launcher-specific checks raise ValueError)."""
    return GENERATORS.get(req.launcher)(req)
