"""The strategy registry, open to third-party plugins.

A package adds a strategy either by calling :func:`register` at import time, or by declaring an
entry point in the ``tfscale.strategies`` group whose object is a :class:`Strategy` subclass
(loaded the first time a strategy is looked up)::

    [project.entry-points."tfscale.strategies"]
    mystrategy = "mypkg.strategy:MyStrategy"

A class registered either way is selected with ``--strategy NAME``, and is launched, checked and
written into job scripts from what its class says (see :class:`Strategy`), like a built-in one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from tfscale.config import options
from tfscale.config.registry import Registry
from tfscale.strategies.base import Strategy

if TYPE_CHECKING:
    from tfscale.config.train_config import TrainConfig

ENTRY_POINT_GROUP = "tfscale.strategies"


def register(name: str, cls: type[Strategy], description: str) -> type[Strategy]:
    """Registers strategy class ``cls`` under ``name`` (``--strategy NAME``).

    Raises:
        TypeError: if ``cls`` is not a Strategy subclass.
    """
    if not (isinstance(cls, type) and issubclass(cls, Strategy)):
        raise TypeError(f"strategy {name!r}: {cls!r} is not a tfscale Strategy subclass")
    return STRATEGIES.add(name, cls, description)


def load_plugins() -> None:
    """Registers the strategies that installed packages declare as entry points and that are
    not registered yet (the registry does this on its first lookup; call it again after
    installing a package into a running process)."""
    STRATEGIES.load_entry_points()


def _adopt(name: str, cls: type[Strategy], source: str) -> None:
    """Registers an entry point's class, described by its docstring's first line."""
    doc = (cls.__doc__ or "").strip().splitlines()
    register(name, cls, doc[0] if doc else f"plugin from {source}")


# The first lookup loads the installed plugins too, so every caller sees them.
STRATEGIES: Registry[type[Strategy]] = Registry("strategy", entry_point_group=ENTRY_POINT_GROUP,
                                                adopt=_adopt)
# Each strategy's options, for the flags and configs (tfscale.config.options).
options.add_source("strategy", lambda: ((entry.name, entry.obj.options) for entry in STRATEGIES))


def strategies_that(test: Callable[[type[Strategy]], bool]) -> list[str]:
    """Sorted names of the registered strategies (plugins included) whose class passes
    ``test``, e.g. ``strategies_that(lambda cls: cls.multi_process())``."""
    return [entry.name for entry in STRATEGIES if test(entry.obj)]


def unread_flags(config: TrainConfig,
                 kind: Literal["owned", "tuning"]) -> dict[str, list[str]]:
    """The strategy flags of ``kind`` (see :meth:`Strategy.owned`, :meth:`Strategy.tuning`)
    that ``config`` sets away from their defaults although its strategy does not read them, in
    field order, each with the strategies that do read it.

    Raises:
        UnknownNameError: for an unknown strategy, listing the available ones.
    """
    reads = STRATEGIES.get(config.strategy).flags()
    declared = options.declared()
    values = {field.name: (getattr(config, field.name), field.default)
              for field in dataclasses.fields(config) if field.name != "options"}
    values.update((name, (config.options[name], option.default))
                  for name, option in declared.items() if name in config.options)
    found: dict[str, list[str]] = {}
    for name, (value, default) in values.items():
        if name in reads or value == default:
            continue
        readers = [entry.name for entry in STRATEGIES if name in getattr(entry.obj, kind)()]
        if readers:
            found[name] = readers
    return found


def check_config(config: TrainConfig) -> None:
    """Checks ``config`` against its strategy's class: no flag that only other strategies
    understand, then the strategy's own :meth:`Strategy.validate_config`. An unknown strategy
    is left to the lookup (:func:`create`, ``tfscale.cli.plugins.validate_names``), whose error
    lists the available ones.

    Raises:
        ValueError: naming the flag and the strategies it applies to.
    """
    if config.strategy not in STRATEGIES:
        return
    foreign = unread_flags(config, "owned")
    if foreign:
        flag, readers = next(iter(foreign.items()))
        raise ValueError(f"--{flag} only applies to "
                         + " or ".join(f"--strategy={name}" for name in readers))
    strategy = STRATEGIES.get(config.strategy)
    strategy.validate_config(strategy.settings(config))


def create(config: TrainConfig) -> Strategy:
    """Instantiates the strategy named by ``config.strategy``.

    Raises:
        UnknownNameError: listing the available strategies.
    """
    return STRATEGIES.get(config.strategy)(config)


options.add_check("strategy", check_config)
