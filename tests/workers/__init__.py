"""Processes that the tests start. The harness's own workers (equivalence, gradient_lag,
hierarchical, sync_bn) load TensorFlow through ``tfscale.cli.command.import_tensorflow``, as
``tfscale.train`` does: Keras without matplotlib, 0.5-1 s less of each process's start-up. The
workers that stand for users' scripts (bn_script, ddl_fit, hvd_keras_fit, mwms_fit,
prepare_script) import TensorFlow as a user's script does."""
