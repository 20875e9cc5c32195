"""The ``multiworker`` strategy: ``tf.distribute.MultiWorkerMirroredStrategy``.

The cluster comes from ``TF_CONFIG`` (written by ``--num_processes N`` or by the user), or
from Slurm's variables under ``srun``. Keras 3's ``model.fit`` needs work-arounds under
this strategy, the ones users' own scripts get from :mod:`tfscale.strategies.keras_multiworker`;
they are on
while the strategy runs.

When every worker runs on one CPU-only x86-64 machine (``--num_processes N``, or a TF_CONFIG
whose workers share a host), the gradients are summed through a shared-memory segment
(``--node_exchange``, :mod:`tfscale.exchange.shared_memory`) instead of TensorFlow's gRPC
ring, which carries them over loopback TCP: for an ``mlp``'s 7.4 MB between two workers, 15.6 ms
against the step's 5.3 ms of compute (bench/RESULTS.md). So are the framework's host values
(stop flags, evaluation sums, the epoch's logs); ``--sync_bn``'s sums stay on TensorFlow's
collectives. On several such hosts with as many workers each, shared memory carries the node
phases of the hierarchical all-reduce and a TensorFlow collective (gRPC) among the workers of
each local index the cross-node phase; the host values then take the strategy's collectives.

Each step's logged loss and metrics are the worker's own, as under Horovod, and each epoch's
are averaged over the workers (``MetricAverage``, first in the callbacks): averaging them every
step, as Keras does under the strategy, was a collective per step (3% of a two-worker ``mlp``
step even through shared memory).

A cluster of one worker with at most one local device has nothing to exchange. There the
strategy runs under TensorFlow's default strategy, whose step is the plain one: under
MultiWorkerMirroredStrategy the same step paid for collectives on a group of one (gradients
and every logged metric), 23% of a 6 ms ``mlp`` step on this project's test machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import warnings
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import numpy as np

from tfscale.cluster import environment as cluster_env
from tfscale.config.options import Option
from tfscale.exchange import sharded_update
from tfscale.exchange.hierarchical import HierarchicalAllReduce
from tfscale.exchange.placement import NODE_EXCHANGE, workers_limits
from tfscale.exchange.setup import transient, worker_reduction
from tfscale.exchange.sharded_update import SHARDED_UPDATE
from tfscale.strategies.base import Rendezvous
from tfscale.strategies.keras_version import check_keras_version
from tfscale.strategies.tf_distribute import TFDistributeStrategy

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

COLLECTIVE = Option("collective", "auto", "multiworker collective implementation.",
                    choices=("auto", "ring", "nccl"), tuning=True)


@contextlib.contextmanager
def _peer_health_check(timeout_s: float) -> Iterator[None]:
    """Makes a dead or stalled peer abort the collectives within about ``timeout_s`` seconds.

    ``CommunicationOptions(timeout_seconds=...)`` is not used for this: in TF 2.21 it holds one
    thread per collective op for the whole timeout (thousands of threads within a minute of
    training, then a crash). The strategy's own peer health check, a ping every
    ``_check_health_interval`` s with a ``_check_health_timeout`` s deadline that aborts all
    collectives when a peer does not answer, does the job with one thread. Its period is a
    private class attribute read when the strategy is created, so it is set around creation.
    """
    from tensorflow.python.distribute import collective_all_reduce_strategy as car

    extended = car.CollectiveAllReduceExtended
    saved = (extended._check_health_interval, extended._check_health_timeout)
    if timeout_s:
        extended._check_health_interval = max(1.0, timeout_s / 2)
        extended._check_health_timeout = max(1.0, timeout_s / 2)
    try:
        yield
    finally:
        extended._check_health_interval, extended._check_health_timeout = saved


class MultiWorkerStrategy(TFDistributeStrategy):
    """One process per worker (TF_CONFIG or Slurm), collective all-reduce across workers.

    Attributes:
        alone: one worker with at most one device: runs under the default strategy.
        reduce: the shared-memory all-reduce of the gradients, or None for TensorFlow's.
        exchange_plan: what carries the gradients inside and across nodes.
    """

    alone = False
    reduce: HierarchicalAllReduce | None = None

    rendezvous = Rendezvous.TF_CONFIG
    # horovodrun starts Horovod ranks only; the other launchers give each rank what its
    # TF_CONFIG is built from.
    options = (NODE_EXCHANGE, SHARDED_UPDATE, COLLECTIVE)
    # Across nodes: its flat ring (--node_exchange=collectives) is TensorFlow's gRPC
    # collective, every hop over TCP; its hierarchical exchange's phase is tfscale's ring.
    host_transports = {"flat": "grpc", "hierarchical": "ring"}
    ring_hop_transport = "tcp"

    @classmethod
    def check_environment(cls) -> None:
        try:
            check_keras_version()
        except RuntimeError as err:
            raise ValueError(str(err)) from None

    def setup(self) -> None:
        import tensorflow as tf

        from tfscale.strategies import keras_multiworker as keras_fix

        if "TF_CONFIG" not in os.environ:
            env = cluster_env.detect()
            if env.launcher == "slurm" and env.size > 1:
                port = int(os.environ.get("TFSCALE_PORT_BASE", cluster_env.DEFAULT_PORT))
                os.environ["TF_CONFIG"] = json.dumps(cluster_env.tf_config(env, port))
        text = os.environ.get("TF_CONFIG", "")
        self._rank, self._size = (0, 1)
        workers: list[str] = []
        if text:
            self._rank, workers = cluster_env.parse_tf_config(text)
            self._size = len(workers)
        if self.config.num_processes > 1 and self.config.num_processes != self._size:
            raise ValueError(f"--num_processes={self.config.num_processes} but TF_CONFIG "
                             f"lists {self._size} workers")
        if not text:
            warnings.warn("--strategy=multiworker without TF_CONFIG runs as a single worker; "
                          "use --num_processes N, or set TF_CONFIG on every worker",
                          stacklevel=2)
        self.alone = self._size == 1 and len(tf.config.list_physical_devices("GPU")) <= 1
        self._patches = contextlib.ExitStack()
        if self.alone:
            self.tf_strategy = tf.distribute.get_strategy()
            return
        implementation = tf.distribute.experimental.CommunicationImplementation
        options = tf.distribute.experimental.CommunicationOptions(
            implementation=getattr(implementation, COLLECTIVE.of(self.config).upper()))
        with _peer_health_check(self.config.collective_timeout_s):
            self.tf_strategy = tf.distribute.MultiWorkerMirroredStrategy(
                communication_options=options)
        self._patches.enter_context(keras_fix.enabled())
        self.reduce = self._shared_memory_reduce(workers)
        # The fix's own exchange for users' scripts then follows --node_exchange's choice.
        keras_fix.set_all_reduce(self.tf_strategy, self.reduce, self.exchange_plan)
        if self.replicas_in_process == 1:
            # Each step's logs stay the worker's own; MetricAverage averages the epoch's.
            keras_fix.keep_logs_local(self.tf_strategy)

    def _shared_memory_reduce(self, workers: list[str]) -> HierarchicalAllReduce | None:
        """The gradients' all-reduce through shared memory where
        :func:`tfscale.exchange.setup.worker_reduction` (which users' scripts share)
        takes it: every worker on one node, one replica each, and no --xla=jit compiling the
        whole step (on CPUs it compiles the model's passes only); else None. A collective.

        Raises:
            ValueError: for ``--node_exchange=shared_memory`` where it cannot run.
        """
        why_not = workers_limits(self.replicas_in_process, self.jit_compiles == "step")
        reduce, self.exchange_plan = worker_reduction(
            self._rank, workers, NODE_EXCHANGE.of(self.config),
            f"gRPC ({COLLECTIVE.of(self.config)} collectives)",
            lambda values: self.all_reduce(values, "sum"), why_not,
            self.config.collective_timeout_s)
        return None if reduce is None else transient(reduce)

    def wrap_optimizer(self, optimizer: keras.optimizers.Optimizer) -> keras.optimizers.Optimizer:
        from tfscale.exchange import timing
        from tfscale.strategies.keras_multiworker import sum_gradients_with

        if self.reduce is not None:
            shard, self.update_sharding = sharded_update.choose(
                SHARDED_UPDATE.of(self.config), optimizer, self.reduce)
            self.sharded_optimizer = optimizer
            return sum_gradients_with(optimizer, self.reduce.sum, shard)
        if timing.CLOCK.enabled and self.replicas_in_process == 1:
            return sum_gradients_with(optimizer, None)  # the strategy's own, timed
        return optimizer

    def all_reduce(self, values: Sequence[float] | np.ndarray, op: str = "mean") -> np.ndarray:
        # With shared memory, the host collectives (the guard's flags, evaluation sums) take
        # it too instead of a gRPC round trip.
        out = None if self.reduce is None else self.reduce.host_all_reduce(values, op)
        return super().all_reduce(values, op) if out is None else out

    def callbacks(self) -> list[keras.callbacks.Callback]:
        if self.alone or self.replicas_in_process > 1:
            return []
        from tfscale.callbacks import MetricAverage

        return [MetricAverage(self)]

    def teardown(self) -> None:
        if not self.alone and hasattr(self, "tf_strategy"):
            from tfscale.strategies import keras_multiworker as keras_fix

            keras_fix.average_logs_with(self.tf_strategy, None)
        if hasattr(self, "_patches"):
            self._patches.close()

    def describe(self) -> str:
        if self.alone:
            return (f"{super().describe()}: one worker, nothing to exchange, so TensorFlow's "
                    "default strategy")
        return f"{super().describe()}; gradients {self.exchange()}"

    @property
    def rank(self) -> int:
        return self._rank

    @property
    def size(self) -> int:
        return self._size

    def distribute_dataset(self, dataset: tf.data.Dataset) -> tf.data.Dataset:
        # Each worker's dataset is already this worker's shard with this worker's batch. With
        # one CPU replica per worker, model.fit iterates it as it is (the Keras fix's
        # per_worker_dataset: a distributed iterator cost 7% of an mlp step); otherwise,
        # building it "from a function" tells TF exactly that (no auto-sharding, no
        # re-batching of a supposed global batch).
        from tfscale.strategies import keras_multiworker as keras_fix

        if not self.alone:
            return keras_fix.per_worker_dataset(dataset)
        return self.tf_strategy.distribute_datasets_from_function(lambda _: dataset)
