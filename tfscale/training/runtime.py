"""Process-wide settings of a training process, for ``tfscale.train`` and users' scripts alike
(:func:`tfscale.setup`): threads and CPU binding, XLA auto-clustering, TF32, cuDNN autotuning,
determinism and Keras's dtype policy, with ``--precision=auto`` resolved for this machine."""

from __future__ import annotations

import os
import sys

from tfscale.cluster import cpu_binding, rank_zero
from tfscale.config.errors import report_script_usage_errors
from tfscale.config.train_config import TrainConfig
from tfscale.training import precision

# TrainConfig's precision names -> Keras dtype policies.
POLICIES = {"fp32": "float32", "mixed_float16": "mixed_float16",
            "mixed_bfloat16": "mixed_bfloat16"}


def configure_runtime(config: TrainConfig) -> None:
    """Process-wide TF/Keras settings; must run before TensorFlow executes any op."""
    import keras
    import tensorflow as tf

    # A user's script (tfscale.setup) that misuses tfscale ends with tfscale's one line.
    report_script_usage_errors()

    threads = cpu_binding.plan(config.cpu_binding, config.intra_op_threads,
                               config.inter_op_threads)
    # Every worker says where it runs: a wrong binding shows only as a slow run.
    print(threads.describe(), file=sys.stderr, flush=True)
    if threads.intra:
        tf.config.threading.set_intra_op_parallelism_threads(threads.intra)
    if threads.inter:
        tf.config.threading.set_inter_op_parallelism_threads(threads.inter)
    tf.config.optimizer.set_jit("autoclustering" if config.xla == "auto" else False)
    tf.config.experimental.enable_tensor_float_32_execution(config.tf32)
    # Read by TF's convolution kernels when they first run, so setting it here is in time.
    os.environ["TF_CUDNN_USE_AUTOTUNE"] = "1" if config.cudnn_autotune else "0"
    if config.deterministic:
        tf.config.experimental.enable_op_determinism()
    keras.mixed_precision.set_global_policy(POLICIES[config.precision])


def resolve_precision(config: TrainConfig) -> TrainConfig:
    """``config`` with ``--precision=auto`` replaced by what this machine computes natively
    (:mod:`tfscale.training.precision`); warns once when an explicit mixed precision is emulated."""
    hardware = precision.detect()
    chosen, warning = precision.resolve(config.precision, hardware)
    if warning:
        rank_zero.log(f"warning: {warning}")
    if chosen != config.precision:
        rank_zero.log(f"--precision=auto: {chosen} on this {hardware.describe()}")
    return config.replace(precision=chosen)
