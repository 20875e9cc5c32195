"""Options that a plugin declares for itself: a strategy's knobs, a dataset reader's.

A strategy (or model, or dataset) lists its options as :class:`Option` declarations in its own
file, and its registry says which plugin declares which (:func:`add_source`); the absl flags of
``tfscale.train`` (in a ``--helpfull`` group of their own), job-script checks,
``TrainConfig.to_argv``, resume checks and results.json's ``config`` are all built from them, so a
plugin from another package brings its flags with it. The chosen values travel in
:attr:`tfscale.config.train_config.TrainConfig.options` (an :class:`Options` mapping); a plugin
reads its own
with ``OPTION.of(config)``, typed as the declaration's default. Light: no TensorFlow here.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar

if TYPE_CHECKING:
    from absl import flags

    from tfscale.config.settings import Settings
    from tfscale.config.train_config import TrainConfig

T = TypeVar("T", bool, int, float, str)


@dataclasses.dataclass(frozen=True)
class Option(Generic[T]):
    """One option: a flag ``--NAME`` and a value in ``config.options``.

    Attributes:
        name: the flag's name (global: two plugins reading one option share its declaration).
        default: its value when not given; its type (bool, int, float or str) is the flag's.
        help: the flag's help text.
        choices: the allowed strings, for a string option ("" = any).
        minimum: the smallest allowed number, for a numeric option.
        tuning: True for a performance knob: another strategy given it warns that it ignores
            it; False: giving it to another strategy is an error.
        changes_training: True when resuming a checkpoint with another value changes what is
            trained (then it needs ``--allow_config_change``); False for where and how fast.
        check: further validation, ``value -> None``, raising ValueError that names the flag.
    """

    name: str
    default: T
    help: str
    choices: tuple[str, ...] = ()
    minimum: float | None = None
    tuning: bool = False
    changes_training: bool = False
    check: Callable[[T], None] | None = dataclasses.field(default=None, compare=False)

    @property
    def help_text(self) -> str:
        """The flag's help, with its choices."""
        return f"{self.help} One of: {', '.join(self.choices)}." if self.choices else self.help

    def validate(self, value: Any) -> Any:
        """``value`` checked against the declaration (an int is taken for a float option).

        Raises:
            ValueError: naming the flag, the value and what is expected.
        """
        kind = type(self.default)
        if kind is float and type(value) is int:
            value = float(value)
        if type(value) is not kind:
            raise ValueError(f"--{self.name}={value!r} is not valid; expected a {kind.__name__}")
        if self.choices and value not in self.choices:
            raise ValueError(f"--{self.name}={value!r} is not valid; choose one of: "
                             f"{', '.join(self.choices)}")
        if (self.minimum is not None and isinstance(value, (int, float))
                and value < self.minimum):
            raise ValueError(f"--{self.name}={value} is not valid; expected a value >= "
                             f"{self.minimum:g}")
        if self.check is not None:
            self.check(value)
        return value

    def of(self, config: TrainConfig | Settings) -> T:
        """This option's value in ``config`` (its default where the config does not hold it),
        or in a plugin's settings (:mod:`tfscale.config.settings`).

        Raises:
            LookupError: when the settings are of a plugin that did not declare this option.
        """
        values = config.options
        if isinstance(values, OwnOptions) and self.name not in values:
            raise LookupError(f"--{self.name} is not an option of {values.owner}; a plugin "
                              f"reads only the options it declares (options= where it "
                              f"registers)")
        value = config.options.get(self.name, self.default)
        return value  # type: ignore[no-any-return]

    def define(self, flag_values: flags.FlagValues, group: str) -> None:
        """Defines ``--NAME`` on ``flag_values``, listed under ``group`` in ``--helpfull``."""
        from absl import flags

        defines: dict[type, Callable[..., Any]] = {
            bool: flags.DEFINE_bool, int: flags.DEFINE_integer, float: flags.DEFINE_float}
        define = defines.get(type(self.default), flags.DEFINE_string)
        define(self.name, self.default, self.help_text, flag_values=flag_values,
               module_name=group)


class Options(Mapping[str, Any]):
    """An immutable, hashable name -> value mapping: the options of one config."""

    def __init__(self, values: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()) -> None:
        self._values = dict(sorted(dict(values).items()))

    def __getitem__(self, name: str) -> Any:
        return self._values[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __hash__(self) -> int:
        return hash(tuple(self._values.items()))

    def __repr__(self) -> str:
        return f"Options({self._values!r})"


class OwnOptions(Options):
    """The options of one plugin only, in its settings (:mod:`tfscale.config.settings`):
    :meth:`Option.of` refuses another plugin's option here rather than give its default."""

    def __init__(self, owner: str,
                 values: Mapping[str, Any] | Iterable[tuple[str, Any]] = ()) -> None:
        super().__init__(values)
        self.owner = owner  # "model 'resnet50'", for the refusal

    def __repr__(self) -> str:
        return f"OwnOptions({self.owner!r}, {dict(self)!r})"


def merge(declarations: Iterable[Option[Any]]) -> dict[str, Option[Any]]:
    """The declarations by name, each once.

    Raises:
        ValueError: when two plugins declare one name differently.
    """
    found: dict[str, Option[Any]] = {}
    for option in declarations:
        seen = found.setdefault(option.name, option)
        if seen != option:
            raise ValueError(f"option --{option.name} is declared twice, differently "
                             f"({seen} and {option}); a plugin must reuse the declaration")
    return found


# Each plugin of a registry with its options: (plugin name, declarations) pairs.
Declarations = Callable[[], Iterable[tuple[str, Sequence[Option[Any]]]]]
# The config field that names a plugin ("strategy", "model", "dataset") -> its registry's.
_SOURCES: dict[str, Declarations] = {}


def add_source(field: str, declarations: Declarations) -> None:
    """Makes the plugins that config field ``field`` names declare options: ``declarations()``
    gives each plugin's name and options (a registry calls this when it is imported)."""
    _SOURCES[field] = declarations


_CHECKS: dict[str, Callable[[TrainConfig], None]] = {}


def add_check(field: str, check: Callable[[TrainConfig], None]) -> None:
    """Makes every config check itself with ``check`` (``config -> None``, raising ValueError
    that names the flag): the strategy registry adds the chosen strategy's own checks, so that
    the config needs to know no strategy."""
    _CHECKS[field] = check


def run_checks(config: TrainConfig) -> None:
    """The checks of :func:`add_check` on ``config``, in the order they were added."""
    for check in _CHECKS.values():
        check(config)


def from_meta(found: Sequence[Option[Any]] | str) -> tuple[Option[Any], ...]:
    """A registry entry's ``options=``: the declarations, or ``"module:attribute"`` naming them
    (so that a declared plugin's options are read without importing its builder's module)."""
    if isinstance(found, str):
        module, _, attribute = found.partition(":")
        return tuple(getattr(importlib.import_module(module), attribute))
    return tuple(found)


def declarations() -> dict[str, dict[str, tuple[Option[Any], ...]]]:
    """Field -> plugin name -> its options, for every registry that declares options."""
    return {field: {name: tuple(options) for name, options in source()}
            for field, source in _SOURCES.items()}


def declared() -> dict[str, Option[Any]]:
    """Every declared option by name, each once.

    Raises:
        ValueError: when two plugins declare one name differently.
    """
    return merge(option for plugins in declarations().values()
                 for options in plugins.values() for option in options)


def resolve(chosen: Mapping[str, str], given: Mapping[str, Any]) -> Options:
    """The options of a config whose plugins are ``chosen`` (field -> name, e.g. strategy ->
    horovod): ``given`` values, each checked against its declaration, and the chosen plugins'
    options at their defaults where not given. Another plugin's option at its default is left
    out (the flags give every option a value).

    Raises:
        ValueError: for a name that nothing declares, or a value its declaration refuses.
    """
    by_field = declarations()
    known = declared()
    unknown = sorted(set(given) - set(known))
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r}: no registered strategy, model or "
                         f"dataset declares it (options: {', '.join(sorted(known))})")
    values = {option.name: option.default for field, plugins in by_field.items()
              for option in plugins.get(chosen.get(field, ""), ())}
    for name, value in given.items():
        value = known[name].validate(value)
        if name in values or value != known[name].default:
            values[name] = value
    return Options(values)


def readers(name: str) -> dict[str, list[str]]:
    """Field -> the plugins of that field that declare option ``name`` (fields with none left
    out)."""
    found = {field: [plugin for plugin, options in plugins.items()
                     if any(option.name == name for option in options)]
             for field, plugins in declarations().items()}
    return {field: plugins for field, plugins in found.items() if plugins}


def check_chosen(chosen: Mapping[str, str], values: Mapping[str, Any], field: str) -> None:
    """Refuses an option of another plugin of ``field`` (a dataset's option with another
    ``--dataset``) set away from its default.

    Raises:
        ValueError: naming the flag and the plugins it applies to.
    """
    plugins = declarations().get(field, {})
    own = {option.name for option in plugins.get(chosen.get(field, ""), ())}
    for name, option in declared().items():
        if name in own or values.get(name, option.default) == option.default:
            continue
        others = [plugin for plugin, options in plugins.items() if option in options]
        if others:
            raise ValueError(f"--{name} only applies to "
                             + " or ".join(f"--{field}={plugin}" for plugin in others))
