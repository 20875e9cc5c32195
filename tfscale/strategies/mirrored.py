"""The ``mirrored`` strategy: ``tf.distribute.MirroredStrategy`` over this machine's devices."""

from __future__ import annotations

import warnings

from tfscale.config.options import Option
from tfscale.strategies.tf_distribute import TFDistributeStrategy

CPU_REPLICAS = Option("cpu_replicas", 0,
                      "mirrored on CPU: split the CPU into N logical devices (replicas).",
                      minimum=0)


class MirroredStrategy(TFDistributeStrategy):
    """One process, one replica per local GPU (or per logical CPU with ``--cpu_replicas``).

    ``--cpu_replicas N`` splits the CPU into N logical devices, so the multi-replica path runs
    and is tested on a machine without GPUs. The process's batch is ``batch_size x replicas``;
    Keras splits it between the replicas and sums their gradients.
    """

    options = (CPU_REPLICAS,)

    @property
    def rank(self) -> int:
        return 0

    @property
    def size(self) -> int:
        return 1

    def setup(self) -> None:
        import tensorflow as tf

        n = CPU_REPLICAS.of(self.config)
        gpus = tf.config.list_physical_devices("GPU")
        if n:
            cpu = tf.config.list_physical_devices("CPU")[0]
            try:
                tf.config.set_logical_device_configuration(
                    cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(n)])
            except RuntimeError as err:
                raise RuntimeError(
                    "--cpu_replicas must be applied before TensorFlow starts; create the "
                    f"strategy before running any TensorFlow op ({err})") from err
            self.tf_strategy = tf.distribute.MirroredStrategy(
                [f"/cpu:{i}" for i in range(n)],
                cross_device_ops=tf.distribute.ReductionToOneDevice())
        elif gpus:
            self.tf_strategy = tf.distribute.MirroredStrategy()
        else:
            warnings.warn(f"--strategy={self.config.strategy} found no GPU and runs one replica "
                          "on the CPU; use --cpu_replicas N to split the CPU into N replicas",
                          stacklevel=2)
            self.tf_strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
