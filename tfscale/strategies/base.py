"""The distribution-strategy plugin interface.

A strategy decides how many processes and replicas train, where the model's variables live, how
gradients are combined and how this process finds its peers. The trainer uses only this
interface, so adding a strategy never touches the trainer. Required hooks are abstract;
optional hooks have working defaults.
"""

from __future__ import annotations

import abc
import contextlib
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from tfscale.shard import Shard

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from tfscale.config import TrainConfig


class Strategy(abc.ABC):
    """Base class of every strategy plugin.

    Attributes:
        launcher: how ``--num_processes N`` starts this strategy's workers: ``""`` (the strategy
            is single-process), ``"horovod"`` (Horovod's Gloo launcher) or ``"tf_config"``
            (one process per worker with a TF_CONFIG on loopback ports).
        jit_scope: what ``--xla=jit`` compiles: ``"step"`` (Keras compiles the whole training
            step, gradient exchange included) or ``"model"`` (only the model's forward and
            backward pass, when the gradient exchange cannot run inside XLA).
    """

    launcher: ClassVar[str] = ""
    jit_scope: ClassVar[str] = "step"

    def __init__(self, config: TrainConfig) -> None:
        self.config = config

    @classmethod
    def check_environment(cls) -> None:
        """Raises ValueError saying what to install when this machine cannot run the strategy
        (called before any worker starts)."""

    def setup(self) -> None:
        """Initialises communication; called once before anything else."""

    def teardown(self) -> None:
        """Releases communication resources; called once at the end, also after errors."""

    @property
    @abc.abstractmethod
    def rank(self) -> int:
        """This process's global index (0 = chief)."""

    @property
    @abc.abstractmethod
    def size(self) -> int:
        """Number of worker processes."""

    @property
    def local_rank(self) -> int:
        """This process's index on its node."""
        return self.rank

    @property
    def local_size(self) -> int:
        """Number of worker processes on this node."""
        return self.size

    @property
    def replicas_in_process(self) -> int:
        """Model replicas driven by this process (several for in-process mirroring)."""
        return 1

    @property
    def num_replicas(self) -> int:
        """Model replicas in the whole job; the global batch is batch_size x this."""
        return self.size * self.replicas_in_process

    @property
    def is_chief(self) -> bool:
        return self.rank == 0

    def shard(self) -> Shard:
        """The part of the data this process reads."""
        return Shard(self.rank, self.size, self.local_rank, self.local_size)

    def scope(self) -> contextlib.AbstractContextManager[object]:
        """Context in which the model and optimizer are created and compiled."""
        return contextlib.nullcontext()

    def distribute_dataset(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        """Adapts this process's (already sharded) dataset for ``model.fit``."""
        return dataset

    def wrap_optimizer(self, optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
        """Adds the gradient exchange to ``optimizer`` when the strategy owns it."""
        return optimizer

    def prepare_model(self, model: keras.Model) -> None:
        """Adjusts a compiled model for this strategy before ``fit``."""
        if self.config.xla == "jit" and self.jit_scope == "model":
            jit_compile_forward(model)

    def callbacks(self) -> list[keras.callbacks.Callback]:
        """Callbacks the strategy needs in ``model.fit``, placed before all others."""
        return []

    @abc.abstractmethod
    def all_reduce(self, values: Sequence[float] | np.ndarray, op: str = "mean") -> np.ndarray:
        """Reduces a small float64 vector across processes (``op``: mean, sum, max, min)."""

    @abc.abstractmethod
    def broadcast(self, values: Sequence[float] | np.ndarray, root: int = 0) -> np.ndarray:
        """Returns ``root``'s copy of a small vector on every process."""

    @abc.abstractmethod
    def broadcast_variables(self, variables: Sequence[keras.Variable], root: int = 0) -> None:
        """Overwrites ``variables`` on every process with ``root``'s values."""

    def barrier(self) -> None:
        """Waits until every process gets here."""
        self.all_reduce([0.0])

    def describe(self) -> str:
        """One line for logs: the strategy and its layout."""
        return (f"{self.config.strategy}: {self.size} process(es) x "
                f"{self.replicas_in_process} replica(s)")


class SingleProcessStrategy(Strategy):
    """A strategy whose replicas all live in this one process: collectives are identities."""

    @property
    def rank(self) -> int:
        return 0

    @property
    def size(self) -> int:
        return 1

    def all_reduce(self, values: Sequence[float] | np.ndarray, op: str = "mean") -> np.ndarray:
        return np.asarray(values, dtype=np.float64)

    def broadcast(self, values: Sequence[float] | np.ndarray, root: int = 0) -> np.ndarray:
        return np.asarray(values, dtype=np.float64)

    def broadcast_variables(self, variables: Sequence[keras.Variable], root: int = 0) -> None:
        return None


def jit_compile_forward(model: keras.Model) -> None:
    """XLA-compiles ``model``'s forward pass; the gradient of a compiled function is compiled
    too, so the backward pass is as well. The rest of the training step (loss bookkeeping,
    gradient exchange, optimizer update) stays outside XLA."""
    import tensorflow as tf

    model.call = tf.function(model.call, jit_compile=True, autograph=False)


@contextlib.contextmanager
def running(strategy: Strategy) -> Iterator[Strategy]:
    """``setup()`` on entry and ``teardown()`` on exit, also on errors."""
    strategy.setup()
    try:
        yield strategy
    finally:
        strategy.teardown()
