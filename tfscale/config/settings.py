"""What each plugin is handed: its settings, not the whole configuration.

A model builder gets :class:`ModelSettings` (the data's shape and the model's own options), a
dataset's builder and its inference rule get :class:`DataSettings` (where the data is, how it is
read and preprocessed, and the dataset's own options), and a strategy gets
:class:`StrategySettings` (the processes, timeouts and the strategy's own options). The
registries make them from the run's :class:`~tfscale.config.train_config.TrainConfig` when the
plugin is called (``MODELS.get(name)(config)`` hands the builder ``ModelSettings.of(config,
name)``), so a plugin sees only what it declared and a change to the rest of the
configuration cannot reach it.

``settings.options`` holds the plugin's own options only, each at its value or default;
``OPTION.of(settings)`` of an option that the plugin did not declare is an error naming both.

Plugins written before this (reading ``config.batch_size`` from a model builder, say) keep
working for one release: a field outside the settings is read from the configuration with an
:class:`UndeclaredSettingWarning` (a FutureWarning, shown by default) that names it.
Light: no TensorFlow.
"""

from __future__ import annotations

import dataclasses
import functools
import warnings
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar, cast

from tfscale.config import options as plugin_options
from tfscale.config.options import Option, OwnOptions

if TYPE_CHECKING:
    from tfscale.config.train_config import TrainConfig

S = TypeVar("S", bound="Settings")
F = TypeVar("F", bound=Callable[..., Any])


class UndeclaredSettingWarning(FutureWarning):
    """A plugin read a configuration field that its settings do not hold."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """The part of a configuration that one kind of plugin reads (subclasses list the fields).

    Attributes:
        options: the plugin's own options (:class:`tfscale.config.options.Option`), by name.
    """

    #: The configuration field that names this kind of plugin ("model", "dataset", ...).
    FIELD: ClassVar[str] = ""

    options: OwnOptions
    # The whole configuration, only for plugins that still read fields outside their settings.
    _config: TrainConfig | None = dataclasses.field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls: type[S], config: TrainConfig | S, plugin: str = "",
           declared: Iterable[Option[Any]] | None = None) -> S:
        """The settings of plugin ``plugin`` (by default the one ``config`` names) in
        ``config``, with the options its registry says it declares (or ``declared``);
        settings are returned as they are."""
        if isinstance(config, Settings):
            if not isinstance(config, cls):
                raise TypeError(f"{cls.__name__} cannot be made from {type(config).__name__}")
            return config
        plugin = plugin or getattr(config, cls.FIELD)
        if declared is None:
            declared = plugin_options.declarations().get(cls.FIELD, {}).get(plugin, ())
        own = OwnOptions(f"{cls.FIELD} {plugin!r}",
                         {option.name: config.options.get(option.name, option.default)
                          for option in declared})
        values = {field.name: getattr(config, field.name) for field in dataclasses.fields(cls)
                  if field.name not in ("options", "_config")}
        return cls(options=own, _config=config, **values)

    @property
    def plugin(self) -> str:
        """The plugin these settings are for (the value of :attr:`FIELD`)."""
        return str(getattr(self, self.FIELD))

    def replace(self: S, **changes: Any) -> S:
        """A copy with ``changes`` (fields of these settings) applied.

        Raises:
            ValueError: for a name these settings do not hold.
        """
        names = {field.name for field in dataclasses.fields(self)} - {"_config"}
        unknown = sorted(set(changes) - names)
        if unknown:
            raise ValueError(f"{type(self).__name__} holds no {unknown[0]!r}; it holds "
                             f"{', '.join(sorted(names))}")
        config = self._config.replace(**changes) if self._config is not None else None
        return dataclasses.replace(self, _config=config, **changes)

    if not TYPE_CHECKING:  # mypy keeps checking attribute names; old plugins still run

        def __getattr__(self, name: str) -> Any:
            config = self.__dict__.get("_config")
            if name.startswith("_") or config is None or not hasattr(config, name):
                raise AttributeError(f"{type(self).__name__} has no attribute {name!r}")
            warnings.warn(
                f"{self.FIELD} {self.plugin!r} reads config.{name}, which "
                f"{type(self).__name__} does not hold; plugins are handed their settings "
                f"only, and reading other fields stops working in the next release (declare "
                f"an option of your own, or read it from tfscale.config.settings)",
                UndeclaredSettingWarning, stacklevel=2)
            return getattr(config, name)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSettings(Settings):
    """What a model builder is handed: the shape of the data and the model's own options."""

    FIELD: ClassVar[str] = "model"

    model: str
    num_classes: int
    image_size: int
    input_channels: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class DataSettings(Settings):
    """What a dataset's builder and inference rule are handed: where the data is, how it is
    read, shuffled, staged and preprocessed, the shapes it yields, and its own options."""

    FIELD: ClassVar[str] = "dataset"

    dataset: str
    data_dir: str
    model_dir: str
    num_classes: int
    image_size: int
    input_channels: int
    seed: int
    validation_steps: int
    shuffle_buffer: int
    prefetch: int
    cache: bool
    deterministic: bool
    stage_dir: str
    skip_corrupt: bool
    record_sharding: bool
    augment: str
    horizontal_flip: str
    eval_crop_fraction: float
    normalization: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class StrategySettings(Settings):
    """What a strategy is handed: how many processes, how long a collective may wait, where
    the run writes, the training choices that change how gradients are exchanged, and its own
    options."""

    FIELD: ClassVar[str] = "strategy"

    strategy: str
    num_processes: int
    collective_timeout_s: float
    model_dir: str
    xla: str
    sync_bn: bool
    gradient_lag: int
    lr_scaling: str
    grad_accum_steps: int


def hand(kind: type[Settings]) -> Callable[[str, F], F]:
    """A registry's ``hand`` (:class:`tfscale.config.registry.Registry`): each builder it
    returns takes the configuration (or settings) first, as before, and calls the plugin with
    ``kind.of(config, name)`` instead."""

    def wrap(name: str, builder: F) -> F:
        @functools.wraps(builder)
        def handed(config: Any, *args: Any, **kwargs: Any) -> Any:
            return builder(kind.of(config, name), *args, **kwargs)

        return cast(F, handed)

    return wrap


def configuration(settings: Settings) -> TrainConfig:
    """The whole configuration ``settings`` were made from: for the framework's own code that
    holds a plugin and must rebuild the run around it (``tfscale.prepare`` given a strategy),
    never for plugins.

    Raises:
        ValueError: for settings made field by field, not from a configuration.
    """
    if settings._config is None:
        raise ValueError(f"these {type(settings).__name__} were not made from a configuration")
    return settings._config
