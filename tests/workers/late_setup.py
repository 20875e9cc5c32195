"""A user's script that calls ``tfscale.setup()`` too late: TensorFlow has run an op first,
which ``multiworker`` cannot start after (``tests/test_run.py``)."""

import tensorflow as tf

import tfscale

tf.constant(1.0) + 1.0
tfscale.setup()
print("not reached: tfscale.setup() accepted a late call")
