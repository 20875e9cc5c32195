"""The bottom layer: collectives, the Horovod runtime and the gradient all-reduce algorithms.

Strategies (:mod:`tfscale.strategies`), callbacks (:mod:`tfscale.callbacks`), the Horovod API
for users' scripts (:mod:`tfscale.horovod`) and users' own loops all build on it; it imports
none of them. TensorFlow, Keras and Horovod are imported inside the functions that use them,
so that reading a strategy class (for ``--help`` or a job script) stays free of them.

- :mod:`~tfscale.exchange.interface`: :class:`Collectives`, what strategies and callbacks
  exchange (small float64 vectors, Keras variables);
- :mod:`~tfscale.exchange.horovod_runtime`: Horovod's process group and collectives for Keras 3;
- :mod:`~tfscale.exchange.optimizer`: gradient reduction inside a Keras 3 optimizer
  (Horovod's ``DistributedOptimizer``, or any reduce function);
- :mod:`~tfscale.exchange.hierarchical`: the topology-aware all-reduce of the ``ddl``
  strategy;
- :mod:`~tfscale.exchange.setup`: setting up a job's gradient exchange (shared memory
  inside a node), one path for the strategies and users' scripts;
- :mod:`~tfscale.scripts.horovod_api`: Horovod's API for users' scripts over that exchange.
"""

from tfscale.exchange.hierarchical import HierarchicalAllReduce, Topology
from tfscale.exchange.horovod_runtime import HorovodCollectives, import_horovod
from tfscale.exchange.interface import Collectives, default_collectives
from tfscale.exchange.optimizer import with_gradient_reduction

__all__ = ["Collectives", "HierarchicalAllReduce", "HorovodCollectives", "Topology",
           "default_collectives", "import_horovod", "with_gradient_reduction"]
