"""The ``ddl`` strategy: IBM DDL's programming model, open, on Horovod's engine.

What DDL gave a TensorFlow program, and where it lives here:

- Learners are processes, one per accelerator, started by a launcher (``ddlrun``/``mpirun``
  then; horovodrun, mpirun, srun, jsrun or ``--num_processes`` here).
- Gradients are averaged by a topology-aware all-reduce: reduce-scatter inside a node,
  all-reduce across nodes, all-gather inside a node
  (:mod:`tfscale.exchange.hierarchical`), on gradients fused into one buffer.
- The callback pair (:mod:`tfscale.callbacks.ddl`): a metric sync that comes first and a
  global-variables broadcast that comes last. In ``tfscale.train`` the strategy's callbacks are
  placed before the trainer's own, so the sync is first; the trainer restores checkpoints before
  ``fit`` and none of its callbacks sets variables at train begin, so its broadcast is the
  position-free :class:`~tfscale.callbacks.BroadcastInitialState` (``DDLGlobalVariablesBroadcast``
  would refuse not to be last). Users' own ``model.fit`` scripts use the pair as DDL did.
- DDL asked users to multiply the learning rate by the number of learners; here that is
  ``--lr_scaling=linear`` (learning rate x the number of processes). ``describe()`` states
  which applies, since the default (``none``) keeps the base rate.

Nodes come from the launcher's host list (Horovod's cross and local ranks); ``--ddl_local_size``
regroups the ranks as ``rank // ddl_local_size`` instead, under any launcher. With
``--num_processes`` the local launcher also gives each group of ``ddl_local_size`` processes its
own host name, so ``--num_processes 2 --ddl_local_size 1`` runs as 2 nodes x 1 process and
``--ddl_local_size 2`` as 1 node x 2.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from tfscale.config.options import Option
from tfscale.exchange.hierarchical import HierarchicalAllReduce
from tfscale.exchange.horovod_runtime import start_horovod
from tfscale.strategies.horovod import FP16_ALLREDUCE, HorovodStrategy

if TYPE_CHECKING:
    import keras

    from tfscale.config.settings import StrategySettings

DDL_LOCAL_SIZE = Option("ddl_local_size", 0,
                        "ddl: processes per node, overriding the launcher's host list.",
                        minimum=0)

# The name the ddlrun front end of launch.jobscript gives ``--strategy`` when none is given.
DDL_STRATEGY = "ddl"


class DDLStrategy(HorovodStrategy):
    """IBM DDL's model on Horovod: learners, DDL callbacks, hierarchical all-reduce."""

    options = (*HorovodStrategy.options, DDL_LOCAL_SIZE)

    @classmethod
    def ranks_per_node(cls, config: StrategySettings) -> int:
        # --ddl_local_size regroups the local workers into simulated nodes of that many.
        return DDL_LOCAL_SIZE.of(config) or config.num_processes

    def setup(self) -> None:
        # Horovod must start with dynamic process sets (registered once the nodes are known),
        # so it is started here, with the knobs set, before the base class would start it.
        self.apply_environment()
        start_horovod()
        super().setup()

    def _node_group_size(self) -> int:
        return DDL_LOCAL_SIZE.of(self.config)

    def gradient_reduction(self) -> HierarchicalAllReduce:
        reduce = HierarchicalAllReduce.create(
            DDL_LOCAL_SIZE.of(self.config), compression=FP16_ALLREDUCE.of(self.config),
            node_exchange_mode=self.node_exchange_mode(),
            timeout_s=self.config.collective_timeout_s)
        self.exchange_plan = reduce.plan
        # Transient: the optimizer applies the reduced gradients within the step.
        return dataclasses.replace(reduce, transient=True)

    def callbacks(self) -> list[keras.callbacks.Callback]:
        from tfscale.callbacks import BroadcastInitialState, DDLMetricSync

        return [DDLMetricSync(self), BroadcastInitialState(self.comm)]

    def describe(self) -> str:
        if self.config.lr_scaling == "linear":
            # The learners, times the micro-batches of a step (the global batch's growth).
            factor = self.size * self.config.grad_accum_steps
            lr = f"learning rate x{factor} (--lr_scaling=linear)"
        else:
            lr = "learning rate not scaled (DDL scales it by the learners: --lr_scaling=linear)"
        assert self.reduce is not None
        return (f"{self.config.strategy}: {self.size} learner(s) on "
                f"{self.reduce.topology.describe()}, hierarchical all-reduce "
                f"({self.exchange()}); {lr}")
