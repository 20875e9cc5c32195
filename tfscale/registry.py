"""Named registries for plugins (models, input pipelines, strategies).

A plugin registers itself under a name with a one-line description; looking up an unknown name
raises :class:`UnknownNameError`, whose message lists the available names.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(ValueError):
    """An unknown plugin name was requested."""


@dataclasses.dataclass(frozen=True)
class Entry(Generic[T]):
    """One registered plugin."""

    name: str
    obj: T
    description: str
    meta: Mapping[str, Any] = dataclasses.field(default_factory=dict)


class Registry(Generic[T]):
    """A mapping from names to plugins of one kind (e.g. ``"model"``)."""

    def __init__(self, kind: str, load: Callable[[], object] | None = None) -> None:
        """``load``, if given, imports the built-in plugins on the first lookup (so that importing
        the package does not import every plugin module, e.g. before ``python -m`` runs one)."""
        self.kind = kind
        self._entries: dict[str, Entry[T]] = {}
        self._load = load

    @property
    def _all(self) -> dict[str, Entry[T]]:
        if self._load is not None:
            load, self._load = self._load, None
            load()
        return self._entries

    def add(self, name: str, obj: T, description: str, **meta: Any) -> T:
        """Registers ``obj`` under ``name``.

        Raises:
            ValueError: if ``name`` is already registered to a different object.
        """
        old = self._entries.get(name)
        if old is not None and old.obj is not obj:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        self._entries[name] = Entry(name, obj, description, dict(meta))
        return obj

    def register(self, name: str, description: str, **meta: Any) -> Callable[[T], T]:
        """Decorator form of :meth:`add`."""

        def decorate(obj: T) -> T:
            return self.add(name, obj, description, **meta)

        return decorate

    def entry(self, name: str) -> Entry[T]:
        """Returns the entry for ``name``.

        Raises:
            UnknownNameError: naming the bad value and listing the valid ones.
        """
        try:
            return self._all[name]
        except KeyError:
            raise UnknownNameError(
                f"unknown {self.kind} {name!r}; available: {', '.join(self.names())}"
            ) from None

    def get(self, name: str) -> T:
        """Returns the plugin registered as ``name`` (see :meth:`entry`)."""
        return self.entry(name).obj

    def names(self) -> list[str]:
        """Sorted registered names."""
        return sorted(self._all)

    def __contains__(self, name: object) -> bool:
        return name in self._all

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter(sorted(self._all.values(), key=lambda e: e.name))

    def describe(self) -> str:
        """One line per entry: ``name  description``."""
        width = max((len(n) for n in self._all), default=0)
        return "\n".join(f"  {e.name:<{width}}  {e.description}" for e in self)
