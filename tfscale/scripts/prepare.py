"""``tfscale.prepare()``: what ``tfscale.train`` does to a model and optimizer, for your script.

A user's own Keras script gets tfscale's features and the strategy its launcher chose with
one call after building the model and optimizer, before ``compile``::

    import tfscale

    tfscale.setup(precision="auto")        # optional; first, before building the model
    model = build_model()                  # any built Keras model
    model, optimizer, callbacks = tfscale.prepare(model, keras.optimizers.SGD(0.1),
                                                  grad_accum_steps=4, sync_bn=True)
    model.compile(optimizer=optimizer, loss=..., metrics=[...])
    model.fit(tfscale.shard_dataset(dataset), callbacks=callbacks, ...)

and runs on 2 local workers with ``tfscale-run --nproc=2 --strategy=horovod script.py``.
``tfscale.train``'s trainer applies the features through the same function
(:func:`tfscale.training.features.apply`), which owns their order.

``compile`` may come after all the features (it replaces none of their changes) or, for a script
that compiled already, before: ``prepare(model)`` then takes the compiled model's optimizer.

The strategy comes from how the script was started (:mod:`tfscale.strategies.launched`).
:func:`setup` starts it once per process, with the runtime settings ``tfscale.train`` applies
(precision policy, CPU threads and binding, determinism); ``prepare`` calls it when the script
did not. Under ``multiworker`` the script must call it before building the model: TensorFlow
configures its collectives at start-up, and the model's variables must be created in the
strategy's scope (``setup`` enters it for the rest of the process).
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, Any

from tfscale.cluster import rank_zero
from tfscale.config.errors import report_script_usage_errors
from tfscale.config.settings import configuration
from tfscale.config.train_config import TrainConfig, config_names
from tfscale.strategies import Strategy, create
from tfscale.strategies.launched import launched_strategy
from tfscale.training import features
from tfscale.training.bn_statistics import MODES
from tfscale.training.runtime import configure_runtime, resolve_precision

if TYPE_CHECKING:
    import keras
    import numpy as np
    import tensorflow as tf

    from tfscale.training.recompute import BlockRule

@dataclasses.dataclass
class _Session:
    """The process's strategy, set up by :func:`setup`, and what tears it down."""

    config: TrainConfig
    strategy: Strategy
    stack: contextlib.ExitStack


_session: _Session | None = None


def setup(strategy: str | None = None, *, precision: str | None = None,
          **options: Any) -> Strategy:
    """Starts this process's strategy and runtime settings, once; call it before building the
    model (required under ``multiworker``, and for a precision other than fp32).

    Args:
        strategy: a registered strategy name; default: the one the launcher chose.
        precision: ``fp32`` (default), ``mixed_float16``, ``mixed_bfloat16`` or ``auto`` (what
            this machine computes natively); sets Keras's global dtype policy.
        **options: other ``tfscale.train`` settings by their flag names, e.g. ``seed``,
            ``deterministic``, ``xla``, ``cpu_binding``, ``node_exchange``,
            ``collective_timeout_s``, ``cycle_time_ms``; and ``sync_bn=True`` when
            :func:`prepare` will synchronize batch norm (Horovod's cycle time depends on it).

    Returns:
        The set-up strategy (``rank``, ``size``, ``is_chief``, ``shard()`` ...). It stays set up
        until the process exits; its scope is entered for the rest of the process. Called
        again without arguments, it returns the same strategy.

    Raises:
        ValueError: for an unknown option or strategy, a value ``tfscale.train`` would refuse,
            or a second call with other settings.
    """
    global _session
    # A usage error below (an unknown option, say) ends the script with one line and exit 2.
    report_script_usage_errors()
    if _session is not None and strategy is None and precision is None and not options:
        return _session.strategy
    config = resolve_precision(_config(
        "tfscale.setup", strategy=strategy or launched_strategy(),
        precision=precision or "fp32", **options))
    if _session is not None:
        if _session.config != config:
            raise ValueError("tfscale.setup: already set up with other settings (strategy="
                             f"{_session.config.strategy!r}, precision="
                             f"{_session.config.precision!r}); call it once, first")
        return _session.strategy
    configure_runtime(config)
    stack = contextlib.ExitStack()
    created = create(config)
    try:
        created.setup()
    except RuntimeError as err:
        if "at program startup" not in str(err):
            raise
        raise ValueError(f"tfscale.setup: --strategy={config.strategy} must start before "
                         "TensorFlow runs anything: call tfscale.setup() first in the script, "
                         "before building the model") from None
    stack.callback(created.teardown)
    rank_zero.set_rank(created.rank)
    stack.enter_context(created.scope())
    _session = _Session(config, created, stack)
    atexit.register(_close)
    return created


def _current(**options: Any) -> Strategy:
    """The strategy set up by :func:`setup`, or a new one set up with ``options``."""
    return _session.strategy if _session is not None else setup(**options)


def _close() -> None:
    global _session
    if _session is not None:
        session, _session = _session, None
        session.stack.close()


def _config(caller: str, **fields: Any) -> TrainConfig:
    """A TrainConfig of ``fields`` (its own validation: the strategy's flags included).

    Raises:
        ValueError: one line, naming ``caller`` and the option.
    """
    names = set(config_names())
    unknown = sorted(set(fields) - names)
    if unknown:
        raise ValueError(f"{caller}: unknown option {unknown[0]!r}; options are "
                         f"tfscale.train's flag names: {', '.join(sorted(names))}")
    try:
        return TrainConfig(**fields)
    except ValueError as err:
        raise ValueError(f"{caller}: {err}") from None


@dataclasses.dataclass
class Prepared:
    """What :func:`prepare` returns; unpacks as ``model, optimizer, callbacks``.

    Attributes:
        model: the prepared model (the same object).
        optimizer: the optimizer to compile with (wrapped for the strategy).
        strategy: the strategy in use.
        resumed_step: the optimizer step restored from ``checkpoint_dir`` (0: fresh start);
            pass ``initial_epoch=resumed_step // steps_per_epoch`` to ``fit``.
    """

    model: keras.Model
    optimizer: keras.optimizers.Optimizer
    strategy: Strategy
    resumed_step: int = 0
    checkpoint_dir: str = ""
    checkpoint_every: int = 0
    keep_checkpoints: int = 3
    bn_statistics: str = "auto"
    bn_statistics_data: Any = None
    bn_statistics_images: int = 1024
    grad_accum_steps: int = 1

    @property
    def callbacks(self) -> list[keras.callbacks.Callback]:
        """New callbacks for ``fit``: the strategy's (broadcast of the initial state, metric
        averaging), the :class:`~tfscale.callbacks.TrainingGuard` (all workers stop together on
        a NaN loss or SIGTERM), the :class:`~tfscale.callbacks.BatchNormStatistics` (batch-norm
        statistics of the current weights, the same on every worker, before each validation,
        at each epoch end and at the end), and chief-only checkpoints into ``checkpoint_dir``
        if given."""
        from tfscale import callbacks as cbs
        from tfscale.training.checkpointing import CheckpointManager

        out = [*self.strategy.callbacks(),
               cbs.TrainingGuard(self.strategy, periods=(self.checkpoint_every,)),
               cbs.BatchNormStatistics(self.bn_statistics_data, self.bn_statistics_images,
                                       comm=self.strategy, micro_batches=self.grad_accum_steps,
                                       mode=self.bn_statistics)]
        if self.checkpoint_dir:
            manager = CheckpointManager(self.checkpoint_dir, self.keep_checkpoints)
            out.append(cbs.Checkpoint(manager, self.checkpoint_every))
        return out

    def __iter__(self) -> Iterator[Any]:
        return iter((self.model, self.optimizer, self.callbacks))


def prepare(model: keras.Model, optimizer: keras.optimizers.Optimizer | str | None = None, *,
            grad_accum_steps: int = 1, sync_bn: bool = False, sync_bn_group: int = 0,
            recompute: BlockRule | None = None, gradient_lag: int = 0,
            precision: str | None = None, checkpoint_dir: str = "", checkpoint_every: int = 0,
            keep_checkpoints: int = 3, bn_statistics: str = "auto",
            bn_statistics_data: Any = None, bn_statistics_images: int = 1024,
            strategy: Strategy | None = None) -> Prepared:
    """Applies tfscale's features to ``model`` and ``optimizer`` under the strategy, in the
    order of the module docstring.

    Args:
        model: a built Keras model, created after :func:`setup` under ``multiworker``.
        optimizer: a Keras optimizer or its name (``"adam"``); None for a compiled ``model``,
            whose optimizer is then prepared in place.
        grad_accum_steps: micro-batches per optimizer step (each ``fit`` batch is split).
        sync_bn: batch-norm statistics over all replicas (groups of ``sync_bn_group``).
        sync_bn_group: replicas per synchronized group; 0 = all.
        recompute: a block rule (layer name -> block name or None): recompute each block's
            activations in the backward pass instead of keeping them.
        gradient_lag: 1 = apply each step's averaged gradients one step later (Horovod-style
            strategies), overlapping the exchange with the next step's compute.
        precision: the precision the model must have been built with (checked; set it with
            :func:`setup`); None = whatever setup chose.
        checkpoint_dir: where the chief saves checkpoints (at each epoch end, or every
            ``checkpoint_every`` steps), keeping ``keep_checkpoints``; the newest one found
            there is restored now (:attr:`Prepared.resumed_step`).
        bn_statistics: ``precise``, ``ema`` or ``auto`` (precise when ``bn_statistics_data``
            is given): how the callbacks bring the batch-norm statistics up to date (see
            ``tfscale.train --bn_statistics`` and :class:`tfscale.callbacks.BatchNormStatistics`).
        bn_statistics_data: this worker's training batches as ``fit`` reads them (a
            ``tf.data.Dataset``), for precise statistics.
        bn_statistics_images: images per recomputation, all workers together.
        strategy: an already set-up strategy (``tfscale.train``'s); default: :func:`setup`'s.

    Returns:
        A :class:`Prepared`.

    Raises:
        ValueError: one line with the reason, for a feature the strategy or model cannot run,
            a model built under another precision or outside the strategy's scope, or an
            unbuilt model.
    """

    own = strategy is None
    if strategy is None:
        # Horovod's cycle time depends on sync_bn (tfscale.strategies.horovod), chosen at setup.
        strategy = _current(sync_bn=sync_bn,
                            **({} if precision is None else {"precision": precision}))
    run = configuration(strategy.config)
    requested = precision if precision not in (None, "auto") else run.precision
    config = _config("tfscale.prepare", **{
        **run.to_dict(), "precision": requested,
        # Errors name the user's model, not tfscale.train's default one.
        **({"model": model.name} if own else {}),
        "grad_accum_steps": grad_accum_steps, "sync_bn": sync_bn, "sync_bn_group": sync_bn_group,
        "recompute": recompute is not None, "gradient_lag": gradient_lag})
    prepared = features.apply(model, optimizer, config, strategy, recompute)
    if bn_statistics not in MODES or (
            bn_statistics == "precise" and bn_statistics_data is None):
        raise ValueError(f"tfscale.prepare: bn_statistics={bn_statistics!r}; expected auto, ema "
                         "or precise (precise needs bn_statistics_data, the training batches)")
    result = Prepared(model, prepared, strategy, 0, checkpoint_dir, checkpoint_every,
                      keep_checkpoints, bn_statistics, bn_statistics_data, bn_statistics_images,
                      grad_accum_steps)
    if checkpoint_dir:
        result.resumed_step = _restore(model, prepared, strategy, checkpoint_dir,
                                       keep_checkpoints)
    return result


def _restore(model: keras.Model, optimizer: keras.optimizers.Optimizer, strategy: Strategy,
             directory: str, keep: int) -> int:
    """Loads the newest checkpoint of ``directory`` (if any) on every worker; returns its step,
    as the chief read it."""
    from tfscale.exchange.optimizer import lag_slots
    from tfscale.training.checkpointing import CheckpointManager

    manager = CheckpointManager(directory, keep)
    meta = manager.restore([*model.weights, *optimizer.variables], optional=lag_slots(optimizer))
    step = int(strategy.broadcast([float(optimizer.iterations.numpy())])[0])
    if meta:
        rank_zero.log(f"tfscale.prepare: resumed from step {step} in {directory}")
    return step


def shard_dataset(dataset: tf.data.Dataset, batch_size: int = 0,
                  strategy: Strategy | None = None) -> tf.data.Dataset:
    """This worker's part of ``dataset``: every ``size``-th element from its rank on.

    Args:
        dataset: unbatched examples (shuffle after sharding, with a per-worker seed).
        batch_size: this worker's batch; when given, the shard is batched (dropping a last,
            smaller batch, which the other workers may not have) and handed to the strategy,
            ready for ``fit`` (under ``multiworker`` it is marked as this worker's own, so that
            Keras does not shard it again). Without it, batch the result yourself, and under
            ``multiworker`` mark it with
            :func:`tfscale.strategies.keras_multiworker.per_worker_dataset`.
        strategy: default: :func:`setup`'s.
    """
    strategy = strategy or _current()
    shard = strategy.shard()
    if shard.count > 1:
        dataset = dataset.shard(shard.count, shard.index)
    if not batch_size:
        return dataset
    return strategy.distribute_dataset(dataset.batch(batch_size, drop_remainder=True))


def shard_arrays(*arrays: np.ndarray, strategy: Strategy | None = None
                 ) -> tuple[np.ndarray, ...]:
    """This worker's rows of ``arrays`` (NumPy arrays of equal length): every ``size``-th row
    from its rank on, after dropping the rows that would make the workers' parts unequal
    (a worker with one batch more would wait forever for the others' gradients).

    Raises:
        ValueError: when the arrays differ in length.
    """
    lengths = {len(a) for a in arrays}
    if len(lengths) > 1:
        raise ValueError(f"tfscale.shard_arrays: the arrays have different lengths "
                         f"{sorted(lengths)}; expected one row per example in each")
    shard = (strategy or _current()).shard()
    usable = (lengths.pop() // shard.count) * shard.count if arrays else 0
    return tuple(a[shard.index:usable:shard.count] for a in arrays)


__all__: Sequence[str] = ("Prepared", "prepare", "setup", "shard_arrays", "shard_dataset")
