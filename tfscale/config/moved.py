"""Modules that moved when the tree was arranged by role, kept importable under their old names.

The public commands keep their ``python -m`` names for good: ``python -m tfscale.train`` runs
:mod:`tfscale.cli.train` (and ``tfscale.run``, ``tfscale.sweep``, ``tfscale.predict``, and the
``tfscale.cluster_env --tf_config`` of job scripts written before). Any other old dotted name
that a user's script may have imported (``from tfscale.sync_bn import synchronize_batch_norm``)
works for one more release, with a ``DeprecationWarning`` that names the new module; the old
name is a view of the new module (its attributes are the new module's).

:func:`install` puts the finder on ``sys.meta_path`` (``import tfscale`` does it); it answers
only for the names of :data:`MOVED`.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys
import types
import warnings
from collections.abc import Sequence

MOVED = {
    "tfscale.train": "tfscale.cli.train",
    "tfscale.run": "tfscale.cli.run",
    "tfscale.sweep": "tfscale.cli.sweep",
    "tfscale.sweep_report": "tfscale.cli.sweep_report",
    "tfscale.predict": "tfscale.cli.predict",
    "tfscale.flags": "tfscale.cli.flags",
    "tfscale.command": "tfscale.cli.command",
    "tfscale.output": "tfscale.cli.output",
    "tfscale.plugins": "tfscale.cli.plugins",
    "tfscale.cluster_env": "tfscale.cli.tf_config",
    "tfscale.cpu_binding": "tfscale.cluster.cpu_binding",
    "tfscale.rank_zero": "tfscale.cluster.rank_zero",
    "tfscale.shard": "tfscale.cluster.shard",
    "tfscale.collectives": "tfscale.exchange",
    "tfscale.collectives.interface": "tfscale.exchange.interface",
    "tfscale.collectives.shared_memory": "tfscale.exchange.shared_memory",
    "tfscale.collectives.placement": "tfscale.exchange.placement",
    "tfscale.collectives.hierarchical": "tfscale.exchange.hierarchical",
    "tfscale.collectives.horovod": "tfscale.exchange.horovod_runtime",
    "tfscale.collectives.optimizer": "tfscale.exchange.optimizer",
    "tfscale.collectives.timing": "tfscale.exchange.timing",
    "tfscale.collectives.exchange": "tfscale.exchange.setup",
    "tfscale.collectives.scripts": "tfscale.scripts.horovod_api",
    "tfscale.options": "tfscale.config.options",
    "tfscale.registry": "tfscale.config.registry",
    "tfscale.tasks": "tfscale.config.tasks",
    "tfscale.targets": "tfscale.config.targets",
    "tfscale.errors": "tfscale.config.errors",
    "tfscale.trainer": "tfscale.training.trainer",
    "tfscale.evaluation": "tfscale.training.evaluation",
    "tfscale.checkpointing": "tfscale.training.checkpointing",
    "tfscale.losses": "tfscale.training.losses",
    "tfscale.metrics": "tfscale.training.metrics",
    "tfscale.export": "tfscale.training.export",
    "tfscale.recompute": "tfscale.training.recompute",
    "tfscale.sync_bn": "tfscale.training.sync_bn",
    "tfscale.optimizers": "tfscale.training.optimizers",
    "tfscale.optimizers.accumulation": "tfscale.training.optimizers.accumulation",
    "tfscale.optimizers.lars": "tfscale.training.optimizers.lars",
    "tfscale.optimizers.schedules": "tfscale.training.optimizers.schedules",
    "tfscale.class_weights": "tfscale.training.class_weights",
    "tfscale.events": "tfscale.training.events",
    "tfscale.results": "tfscale.training.results",
    "tfscale.model_dir_lock": "tfscale.training.model_dir_lock",
    "tfscale.runtime": "tfscale.training.runtime",
    "tfscale.precision": "tfscale.training.precision",
    "tfscale.files": "tfscale.training.files",
    "tfscale.durations": "tfscale.training.durations",
    "tfscale.config_change": "tfscale.training.resume",
    "tfscale.strategies.environment": "tfscale.strategies.launched",
    "tfscale.keras_version": "tfscale.strategies.keras_version",
    "launch.local": "tfscale.scripts.launcher",
    "tfscale.forecast.cli": "tfscale.cli.forecast",
}
# Run as ``python -m OLD``: public command names, not deprecated.
COMMANDS = frozenset({"tfscale.train", "tfscale.run", "tfscale.sweep", "tfscale.predict",
                      "tfscale.cluster_env"})


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name: str, path: Sequence[str] | None,
                  target: types.ModuleType | None = None) -> importlib.machinery.ModuleSpec | None:
        new = MOVED.get(name)
        if new is None:
            return None
        if name in COMMANDS:
            # python -m OLD (or runpy): the new module's file, run or imported under the old
            # name (a command's module: nothing in it is shared state).
            spec = importlib.util.find_spec(new)
            if spec is None or spec.origin is None:
                return None
            return importlib.util.spec_from_file_location(name, spec.origin)
        is_package = importlib.util.find_spec(new) is not None and bool(
            getattr(importlib.util.find_spec(new), "submodule_search_locations", None))
        return importlib.util.spec_from_loader(name, self, is_package=is_package)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType | None:
        return None

    def exec_module(self, module: types.ModuleType) -> None:
        old = module.__name__
        new = importlib.import_module(MOVED[old])
        warnings.warn(f"{old} moved to {new.__name__}; import it from there (the old name "
                      "goes in the next release)", DeprecationWarning, stacklevel=2)
        module.__dict__.update({k: v for k, v in vars(new).items()
                                if k not in ("__name__", "__spec__", "__loader__", "__path__",
                                             "__package__")})
        module.__getattr__ = lambda name: getattr(new, name)  # type: ignore[method-assign]


def install() -> None:
    """Puts the finder of the old names first on ``sys.meta_path``, once (first: a stale copy
    of an old module elsewhere on the path must not be found instead)."""
    if not any(isinstance(f, _Finder) for f in sys.meta_path):
        sys.meta_path.insert(0, _Finder())
