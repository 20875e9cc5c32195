"""The strategy registry, open to third-party plugins.

A package adds a strategy either by calling :func:`register` at import time, or by declaring an
entry point in the ``tfscale.strategies`` group whose object is a :class:`Strategy` subclass
(loaded the first time a strategy is looked up)::

    [project.entry-points."tfscale.strategies"]
    mystrategy = "mypkg.strategy:MyStrategy"

A class registered either way is selected with ``--strategy NAME``.
"""

from __future__ import annotations

import importlib.metadata
import warnings
from typing import TYPE_CHECKING

from tfscale.registry import Registry
from tfscale.strategies.base import Strategy

if TYPE_CHECKING:
    from tfscale.config import TrainConfig

STRATEGIES: Registry[type[Strategy]] = Registry("strategy")
ENTRY_POINT_GROUP = "tfscale.strategies"
_plugins_loaded = False


def register(name: str, cls: type[Strategy], description: str) -> type[Strategy]:
    """Registers strategy class ``cls`` under ``name`` (``--strategy NAME``).

    Raises:
        TypeError: if ``cls`` is not a Strategy subclass.
    """
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise TypeError(f"strategy {name!r}: {cls!r} is not a tfscale Strategy subclass")
    return STRATEGIES.add(name, cls, description)


def load_plugins() -> None:
    """Registers the strategies that installed packages declare as entry points (once)."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in STRATEGIES:
            continue
        try:
            cls = ep.load()
            doc = (cls.__doc__ or "").strip().splitlines()
            register(ep.name, cls, doc[0] if doc else f"plugin from {ep.value}")
        except Exception as err:  # a broken plugin must not break the built-in strategies
            warnings.warn(f"strategy plugin {ep.name!r} ({ep.value}) failed to load: {err}",
                          stacklevel=2)


def create(config: TrainConfig) -> Strategy:
    """Instantiates the strategy named by ``config.strategy``.

    Raises:
        UnknownNameError: listing the available strategies.
    """
    load_plugins()
    return STRATEGIES.get(config.strategy)(config)
