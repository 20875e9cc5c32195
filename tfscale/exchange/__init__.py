"""Everything that moves gradients between workers: the bottom of tfscale (docs/GLOSSARY.md).

Strategies, callbacks, the Horovod API for users' scripts (:mod:`tfscale.horovod`) and users'
own loops build on it; it imports none of them. TensorFlow, Keras and Horovod are imported
inside the functions that use them, so that reading a strategy class (for ``--help`` or a job
script) stays free of them.

- :mod:`~tfscale.exchange.interface`: :class:`Collectives`, the host collectives strategies and
  callbacks use (small float64 vectors, Keras variables);
- :mod:`~tfscale.exchange.horovod_runtime`: Horovod's process group for Keras 3, its start-up
  and process sets;
- :mod:`~tfscale.exchange.tf_distribute`: host collectives through a ``tf.distribute`` strategy;
- :mod:`~tfscale.exchange.topology`: which ranks share a node;
- :mod:`~tfscale.exchange.placement`: what carries the node exchange (``--node_exchange``);
- :mod:`~tfscale.exchange.shared_memory`: the node exchange through shared memory;
- :mod:`~tfscale.exchange.socket_ring`: an all-reduce ring over TCP;
- :mod:`~tfscale.exchange.cross_node`: the cross-node sum of ``multiworker``'s hierarchical
  all-reduce, over that ring;
- :mod:`~tfscale.exchange.fusion`: many tensors as one buffer;
- :mod:`~tfscale.exchange.hierarchical`: the hierarchical all-reduce;
- :mod:`~tfscale.exchange.optimizer`: the gradient exchange inside a Keras 3 optimizer
  (gradient lag and accumulation included);
- :mod:`~tfscale.exchange.setup`: setting up a job's exchange, one path for the strategies and
  users' scripts;
- :mod:`~tfscale.exchange.timing`: the exchange's share of each step.
"""

from tfscale.exchange.hierarchical import HierarchicalAllReduce
from tfscale.exchange.horovod_runtime import HorovodCollectives, import_horovod
from tfscale.exchange.interface import Collectives, default_collectives
from tfscale.exchange.optimizer import with_gradient_reduction
from tfscale.exchange.topology import Topology

__all__ = ["Collectives", "HierarchicalAllReduce", "HorovodCollectives", "Topology",
           "default_collectives", "import_horovod", "with_gradient_reduction"]
