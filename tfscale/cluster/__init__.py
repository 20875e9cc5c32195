"""Who am I, who are my peers, where do I run: a process's place in its job.

The rank, size and local rank a launcher gave this process (:mod:`~tfscale.cluster.environment`,
from horovodrun, mpirun, srun, jsrun, PMI or a TF_CONFIG), the chief-only helpers
(:mod:`~tfscale.cluster.rank_zero`), its share of the data (:mod:`~tfscale.cluster.shard`), its
cores (:mod:`~tfscale.cluster.cpu_binding`) and the batch system's warning signal
(:mod:`~tfscale.cluster.preemption`). No TensorFlow here.
"""
