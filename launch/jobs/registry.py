"""The job-script generators, by launcher name.

A generator is a function ``JobRequest -> str`` (the script) registered under its launcher's
name with a one-line description, the rendezvous its launcher's ranks can make (horovodrun:
Horovod's only) and the request defaults of its kind of machine (a Summit-style LSF node has 6
GPUs and 42 cores). Asking for an unknown launcher lists the known ones.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from launch.jobs.spec import JobRequest
from tfscale.config.registry import Registry
from tfscale.strategies import Rendezvous, strategies_that

Generator = Callable[[JobRequest], str]
GENERATORS: Registry[Generator] = Registry("launcher")


def register(name: str, description: str,
             rendezvous: frozenset[Rendezvous] = frozenset(Rendezvous) - {Rendezvous.NONE},
             **defaults: Any) -> Callable[[Generator], Generator]:
    """Registers a generator; ``rendezvous`` are the ways its launcher's ranks can find each
    other (a strategy of another is refused), ``defaults`` JobRequest fields for it."""
    return GENERATORS.register(name, description, defaults=defaults, rendezvous=rendezvous)


def request(launcher: str, **fields: Any) -> JobRequest:
    """A validated JobRequest for ``launcher``: its defaults, overridden by ``fields``.

    Raises:
        UnknownNameError: for an unknown launcher (listing the known ones).
        ValueError: for an impossible request.
    """
    defaults = GENERATORS.entry(launcher).meta["defaults"]
    req = JobRequest(launcher=launcher, **{**defaults, **fields})
    _check_rendezvous(req)
    return req


def starts(launcher: str) -> frozenset[Rendezvous]:
    """The rendezvous ``launcher``'s ranks can make (its generator's declaration)."""
    found: frozenset[Rendezvous] = GENERATORS.entry(launcher).meta["rendezvous"]
    return found


def _check_rendezvous(req: JobRequest) -> None:
    """Refuses a strategy of several ranks whose rendezvous the launcher cannot set up, naming
    the strategies it starts and the launchers that start this one."""
    cls = req.strategy_class
    if req.total_ranks == 1 or cls.rendezvous in starts(req.launcher):
        return
    able = strategies_that(lambda c: c.multi_process() and c.rendezvous in starts(req.launcher))
    under = [name for name in GENERATORS.names() if cls.rendezvous in starts(name)]
    raise ValueError(f"{req.launcher} cannot start --strategy={req.strategy} jobs; it starts "
                     f"{', '.join(able)} jobs, and {req.strategy} runs under "
                     f"{', '.join(sorted(under))}")


def render(req: JobRequest) -> str:
    """The job script for ``req`` (launcher-specific checks raise ValueError)."""
    return GENERATORS.get(req.launcher)(req)
