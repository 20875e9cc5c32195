"""Named registries for plugins (models, input pipelines, strategies).

A plugin registers itself under a name with a one-line description; looking up an unknown name
raises :class:`UnknownNameError`, whose message lists the available names.

A plugin can also be *declared*: its name, description and metadata, and where its object lives
(``"module:attribute"``). The module is imported only when the object itself is fetched, so
listing the plugins, checking a name or reading its metadata (a model's task, say) does not
import the modules that build them, nor TensorFlow with them.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import warnings
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from tfscale.config.tasks import check_task

T = TypeVar("T")


class UnknownNameError(ValueError):
    """An unknown plugin name was requested."""


class Entry(Generic[T]):
    """One registered plugin: its name, description and metadata, and the plugin itself, which
    a declared entry imports from ``source`` (``"module:attribute"``) the first time it is read.
    """

    def __init__(self, name: str, description: str, meta: Mapping[str, Any], *,
                 obj: T | None = None, source: str = "") -> None:
        if (obj is None) == (not source):
            raise ValueError(f"plugin {name!r} needs exactly one of an object and a source")
        self.name = name
        self.description = description
        self.meta: Mapping[str, Any] = dict(meta)
        self.source = source
        self._obj = obj

    @property
    def loaded(self) -> bool:
        """Whether the plugin object is at hand (always, unless declared and not yet read)."""
        return self._obj is not None

    @property
    def obj(self) -> T:
        """The plugin; a declared one's module is imported on first use."""
        if self._obj is None:
            module, _, attribute = self.source.partition(":")
            self._obj = getattr(importlib.import_module(module), attribute)
        return self._obj

    def __repr__(self) -> str:
        return f"Entry({self.name!r}, {self.source or self._obj!r})"


class Registry(Generic[T]):
    """A mapping from names to plugins of one kind (e.g. ``"model"``)."""

    def __init__(self, kind: str, load: Callable[[], object] | None = None,
                 entry_point_group: str = "",
                 adopt: Callable[[str, Any, str], object] | None = None,
                 hand: Callable[[str, T], T] | None = None) -> None:
        """``load``, if given, imports the built-in plugins on the first lookup (so that importing
        the package does not import every plugin module, e.g. before ``python -m`` runs one).
        ``entry_point_group``, if given, names the entry-point group through which installed
        packages add plugins: on the first lookup each such entry point's module is imported,
        and registers its plugins as it is imported (see :meth:`load_entry_points`). ``adopt``,
        if given, registers what an entry point names when importing it registered nothing
        under the entry point's name: ``adopt(name, loaded object, entry point value)`` (the
        strategies' entry points name the class itself). ``hand``, if given, wraps each plugin
        that :meth:`get` returns: ``hand(name, plugin)`` (the models' and datasets' registries
        hand a builder its settings, :mod:`tfscale.config.settings`, instead of the whole
        configuration)."""
        self.kind = kind
        self._hand = hand
        self._handed: dict[str, T] = {}
        self.entry_point_group = entry_point_group
        self._adopt = adopt
        self._entries: dict[str, Entry[T]] = {}
        self._load = load
        if entry_point_group:
            self._load = self._load_all(load)

    def _load_all(self, builtin: Callable[[], object] | None) -> Callable[[], None]:
        def load() -> None:
            if builtin is not None:
                builtin()
            self.load_entry_points()

        return load

    def load_entry_points(self) -> None:
        """Imports the module of every entry point in :attr:`entry_point_group` whose name is not
        registered yet; the module registers the plugin (``@register(...)``) as it is imported,
        or the registry's ``adopt`` registers the object the entry point names.
        A plugin that fails to import, or registers nothing under its entry point's name, is
        reported in a warning and left out: a broken package must not break the others.
        Installed plugins' modules are imported on the first lookup, and with them whatever
        they import (TensorFlow, for a model), so ``--list`` is slower with plugins installed."""
        for point in importlib.metadata.entry_points(group=self.entry_point_group):
            if point.name in self._entries:
                continue
            try:
                loaded = point.load()
                if point.name not in self._entries and self._adopt is not None:
                    self._adopt(point.name, loaded, point.value)
            except Exception as err:
                warnings.warn(f"{self.kind} plugin {point.name!r} ({point.value}) failed to "
                              f"load: {err}", stacklevel=2)
                continue
            if point.name not in self._entries:
                warnings.warn(f"{self.kind} plugin {point.name!r}: importing {point.value} "
                              f"registered no {self.kind} of that name", stacklevel=2)

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
        self._check_free(name, obj)
        self._entries[name] = Entry(name, description, meta, obj=obj)
        return obj

    def declare(self, name: str, source: str, description: str, **meta: Any) -> None:
        """Registers the plugin at ``source`` (``"module:attribute"``) under ``name`` without
        importing it: the module is imported when the plugin is fetched (:meth:`get`).

        Raises:
            ValueError: if ``name`` is already registered, or ``source`` is not
                ``"module:attribute"``.
        """
        module, _, attribute = source.partition(":")
        if not module or not attribute.isidentifier():
            raise ValueError(f"{self.kind} {name!r}: source {source!r} is not 'module:attribute'")
        self._check_free(name, None)
        self._entries[name] = Entry(name, description, meta, source=source)

    def _check_free(self, name: str, obj: T | None) -> None:
        """Raises ValueError unless ``name`` is free or already holds ``obj`` (registering the
        same object twice, as a re-imported module does, is harmless)."""
        old = self._entries.get(name)
        if old is not None and not (obj is not None and old.loaded and old.obj is obj):
            raise ValueError(f"{self.kind} {name!r} is already registered")

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
        """Returns the plugin registered as ``name`` (see :meth:`entry`), as the registry's
        ``hand`` wraps it."""
        plugin = self.entry(name).obj
        if self._hand is None:
            return plugin
        handed = self._handed.get(name)
        if handed is None or getattr(handed, "__wrapped__", None) is not plugin:
            handed = self._handed[name] = self._hand(name, plugin)
        return handed

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


class TaskRegistry(Registry[T]):
    """A registry whose plugins each serve one task (:mod:`tfscale.config.tasks`): models and
    datasets. Registering checks the task; :meth:`task_of` reads it without importing a
    declared plugin."""

    def register_for(self, name: str, description: str, task: str,
                     **meta: Any) -> Callable[[T], T]:
        """Decorator registering a builder under ``name`` for ``task``, with the registry's
        own metadata in ``meta`` (a dataset's recognizer, say).

        Raises:
            ValueError: for an unknown task or a name already registered.
        """
        check_task(task, f"{self.kind} {name!r}")
        return self.register(name, description, task=task, **meta)

    def declare_for(self, name: str, builder: str, description: str, task: str,
                    **meta: Any) -> None:
        """Registers the builder at ``builder`` (``"module:function"``) under ``name`` for
        ``task`` without importing its module (see :meth:`Registry.declare`).

        Raises:
            ValueError: for an unknown task or a name already registered.
        """
        check_task(task, f"{self.kind} {name!r}")
        self.declare(name, builder, description, task=task, **meta)

    def task_of(self, name: str) -> str:
        """The task of registered ``name``.

        Raises:
            UnknownNameError: listing the registered names.
        """
        return str(self.entry(name).meta["task"])
