"""The distribution-strategy plugin interface.

A strategy decides how many processes and replicas train, where the model's variables live, how
gradients are combined and how this process finds its peers. The trainer uses only this
interface, so adding a strategy never touches the trainer. Required hooks are abstract;
optional hooks have working defaults.

A strategy is also the one owner of what it is: its class attributes say how its ranks find
each other (its rendezvous, which decides how they are started), which flags are its own and
what environment its ranks need. The local launcher, ``launch.jobscript``, config validation and
sweeps read them from the class, so adding a strategy is one file::

    # mypkg/strategy.py
    from tfscale.strategies.horovod import HorovodStrategy

    class TunedHorovod(HorovodStrategy):
        # Horovod with our own gradient compression; started, checked and written into job
        # scripts as Horovod is (the class attributes are inherited).
        def wrap_optimizer(self, optimizer):
            ...

plus its registration: ``register("tuned", TunedHorovod, "...")`` at import time, or an
entry point in the ``tfscale.strategies`` group (see :mod:`tfscale.strategies.registry`). Then
``--strategy=tuned`` trains with ``--num_processes N``, in sweeps and in every job script that
starts Horovod ranks.
"""

from __future__ import annotations

import abc
import contextlib
import enum
import platform
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from tfscale.cluster.shard import Shard
from tfscale.config.options import Option
from tfscale.config.settings import StrategySettings
from tfscale.exchange import sharded_update

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from tfscale.config.train_config import TrainConfig
    from tfscale.exchange.placement import ExchangePlan


class Rendezvous(enum.StrEnum):
    """How a strategy's ranks find each other once a launcher started them (docs/GLOSSARY.md);
    a job script's launcher must be able to set it up."""

    #: One process: nothing to start beyond it.
    NONE = ""
    #: One process per worker, each given a TF_CONFIG that lists the cluster and its index
    #: (``--num_processes``: loopback ports; job scripts: built from the launcher's variables).
    TF_CONFIG = "tf_config"
    #: Horovod ranks: a Gloo rendezvous (``--num_processes``, horovodrun) or MPI (mpirun, srun
    #: with a PMI plugin, jsrun); the job checks that its Horovod was built for that controller.
    HOROVOD = "horovod"


class Strategy(abc.ABC):
    """Base class of every strategy plugin.

    The class attributes and classmethods describe the strategy without creating it and
    without importing TensorFlow: launchers, job-script generators and config validation read
    them, so a strategy registered from another package is launched and checked exactly like a
    built-in one. Import TensorFlow, Keras and Horovod inside the methods that use them.

    Attributes:
        rendezvous: how its ranks find each other (:class:`Rendezvous`), which decides how
            ``--num_processes N`` starts them and which launchers' job scripts can (each
            generator says which rendezvous it sets up); ``NONE`` = single-process.
        jit_scope: what ``--xla=jit`` compiles (a property: it may depend on the devices set
            up): ``"step"`` (Keras compiles the whole training step, gradient exchange
            included) or ``"model"`` (only the model's forward and backward pass, when the
            gradient exchange cannot run inside XLA); the class's ``_jit_scope`` by default.
        one_rank_per_gpu: each rank drives exactly one GPU (job scripts refuse
            ``--gpus_per_rank`` > 1).
        owned_flags: general config fields that mean nothing to other strategies: setting
            one under another strategy is an error.
        options: the strategy's own options (:class:`tfscale.config.options.Option`), declared in
            its file: flags, ``--helpfull``'s group, job-script checks and ``config.options``
            come from them. A non-tuning one is refused under other strategies; a tuning one
            warns there that it is ignored.
        host_transports: for the forecast (``tfscale.forecast --strategy``), whose host work per
            byte its exchange across nodes does, by algorithm (``"flat"``, ``"hierarchical"``):
            ``"tcp"`` (MPI or another library over raw TCP), ``"ring"`` (tfscale's socket
            ring), ``"grpc"`` (TensorFlow's gRPC collective).
        ring_hop_transport: for the forecast, how its flat ring crosses between two ranks of a
            node: ``"shared_memory"`` (Open MPI, NCCL) or ``"tcp"`` (loopback TCP).
    """

    rendezvous: ClassVar[Rendezvous] = Rendezvous.NONE
    _jit_scope: ClassVar[str] = "step"
    one_rank_per_gpu: ClassVar[bool] = False
    owned_flags: ClassVar[tuple[str, ...]] = ()
    options: ClassVar[tuple[Option[Any], ...]] = ()
    host_transports: ClassVar[dict[str, str]] = {"flat": "tcp", "hierarchical": "tcp"}
    ring_hop_transport: ClassVar[str] = "shared_memory"
    # What carries the gradients inside and across nodes, once set up (exchange() says it).
    exchange_plan: ExchangePlan | None = None
    # How the optimizer's update is shared out, where it is (exchange() adds it), else "",
    # and the optimizer whose update it is.
    update_sharding: str = ""
    sharded_optimizer: keras.optimizers.Optimizer | None = None

    def __init__(self, config: TrainConfig | StrategySettings) -> None:
        self.config = self.settings(config)

    @classmethod
    def settings(cls, config: TrainConfig | StrategySettings) -> StrategySettings:
        """What of ``config`` the strategy is handed: :class:`StrategySettings` with this
        class's own options (its instance's ``config``, its classmethods' argument)."""
        return StrategySettings.of(config, declared=cls.options)

    @classmethod
    def multi_process(cls) -> bool:
        """Whether the strategy runs several processes (``--num_processes N``, job scripts)."""
        return cls.rendezvous != Rendezvous.NONE

    @classmethod
    def owned(cls) -> tuple[str, ...]:
        """The flags that are errors under other strategies: owned fields, non-tuning options."""
        return (*cls.owned_flags, *(o.name for o in cls.options if not o.tuning))

    @classmethod
    def tuning(cls) -> tuple[str, ...]:
        """The performance knobs that other strategies ignore with a warning."""
        return tuple(o.name for o in cls.options if o.tuning)

    @classmethod
    def flags(cls) -> tuple[str, ...]:
        """The strategy-specific flags it reads (owned fields and options)."""
        return (*cls.owned_flags, *(o.name for o in cls.options))

    @classmethod
    def validate_config(cls, config: StrategySettings) -> None:
        """Raises ValueError, naming the flag and what is expected, for a config this strategy
        cannot run (called when the config is built, before TensorFlow loads)."""

    @classmethod
    def environment(cls, config: StrategySettings) -> dict[str, str]:
        """Environment variables every rank needs for ``config``: job scripts export them
        (a value already set on the cluster wins) and ``setup`` applies them."""
        return {}

    @classmethod
    def ranks_per_node(cls, config: StrategySettings) -> int:
        """Processes per simulated node when ``--num_processes`` starts the workers on this
        machine (all of them on one node unless the strategy regroups them)."""
        return config.num_processes

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
    def jit_scope(self) -> str:
        return self._jit_scope

    @property
    def jit_compiles(self) -> str | None:
        """What this run's ``--xla=jit`` compiles (:attr:`jit_scope`); None without it."""
        return self.jit_scope if self.config.xla == "jit" else None

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
        if self.jit_compiles == "model":
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

    def hosts(self) -> list[str]:
        """Every process's host name, in rank order (a collective: every process calls it)."""
        from tfscale.exchange.placement import gather_strings

        return gather_strings(platform.node(), self.rank, self.size,
                              lambda values: self.all_reduce(values, "sum"))

    def exchange(self) -> str:
        """What carries the gradients inside a node and across nodes, for the logs and
        results.json: :attr:`exchange_plan`, set by strategies that exchange gradients between
        processes ("" for the others)."""
        if self.exchange_plan is None:
            return ""
        sharded = self.update_sharding
        if sharded and sharded_update.refused(self.sharded_optimizer):
            sharded = "SGD's momentum update not sharded (no room in /dev/shm for its weights)"
        return self.exchange_plan.describe() + (f"; {sharded}" if sharded else "")

    def describe(self) -> str:
        """One line for logs: the strategy and its layout."""
        return (f"{self.config.strategy}: {self.size} process(es) x "
                f"{self.replicas_in_process} replica(s)")

    def replica_sum(self, tensor: tf.Tensor, group_size: int = 0) -> tf.Tensor:
        """Inside the traced training step: ``tensor`` summed over the replicas of this
        replica's group (``group_size`` consecutive replicas; 0 = all of them).

        Differentiable: the gradient of the sum is the sum of the group's upstream gradients,
        which is what the loss averaged over all replicas needs. Synchronized batch norm
        (:mod:`tfscale.training.sync_bn`) sums its statistics with it. With one replica it is the
        tensor
        itself; strategies of several replicas override it, usually with
        :meth:`_sum_in_groups` over their own sum of all replicas.

        Raises:
            ValueError: when ``group_size`` does not divide the number of replicas.
            NotImplementedError: for a strategy of several replicas that does not override it.
        """
        replica_groups(group_size, self.num_replicas)
        if self.num_replicas > 1:
            raise NotImplementedError(
                f"--strategy={self.config.strategy} runs {self.num_replicas} replicas but has no "
                "in-graph sum over them (Strategy.replica_sum), which --sync_bn needs")
        return tensor

    def _sum_in_groups(self, all_sum: Callable[[tf.Tensor], tf.Tensor], tensor: tf.Tensor,
                       replica: int | tf.Tensor, group_size: int) -> tf.Tensor:
        """``tensor`` summed over the group of replica ``replica`` with one ``all_sum`` (a
        differentiable in-graph sum over all replicas).

        Each replica puts its tensor in its group's row of an otherwise zero matrix of one row
        per group; the sum over all replicas holds every group's sum, and each replica keeps
        its group's row. Its gradient is right as it stands: the sum's gradient sums the
        upstream gradients, which are zero outside each replica's own row. It moves one row
        per group, fewer than an all-gather's one row per replica, and needs no process sets.
        """
        import tensorflow as tf

        groups = replica_groups(group_size, self.num_replicas)
        if groups == 1:
            return all_sum(tensor)
        group = replica // (group_size or self.num_replicas)
        one_hot = tf.one_hot(group, groups, dtype=tensor.dtype)
        rows = tf.reshape(one_hot, [groups] + [1] * tensor.shape.rank) * tensor[tf.newaxis]
        return all_sum(rows)[group]  # a slice, whose gradient is a dense tensor


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


def replica_groups(group_size: int, num_replicas: int) -> int:
    """Number of groups of ``group_size`` consecutive replicas among ``num_replicas`` (0 = one
    group of all).

    Raises:
        ValueError: naming ``--sync_bn_group`` when ``group_size`` does not divide the replicas.
    """
    if group_size < 0 or (group_size and num_replicas % group_size):
        raise ValueError(f"--sync_bn_group={group_size} must divide the number of replicas, "
                         f"{num_replicas} (or be 0 for all of them)")
    return num_replicas // group_size if group_size else 1


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
