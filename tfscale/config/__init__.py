"""A run's options: the frozen, validated configuration, the plugin registries and options.

:mod:`~tfscale.config.train_config` (``TrainConfig``), :mod:`~tfscale.config.options` (the
options a plugin declares for itself), :mod:`~tfscale.config.registry` (named registries of
plugins), :mod:`~tfscale.config.tasks`, :mod:`~tfscale.config.targets` (what a run reports and
``--target_metric``) and :mod:`~tfscale.config.errors` (exit codes). Data modules: no
TensorFlow, and nothing above them.
"""
