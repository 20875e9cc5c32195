"""The trainer and what it applies, measures and writes.

:mod:`~tfscale.training.trainer` (config + strategy -> data, model, ``fit`` -> results),
evaluation, checkpoints, losses, metrics, the exported model, batch-norm statistics,
synchronized batch norm, recomputation, optimizers and schedules, resuming, results and events.
It receives the model and dataset builders from the command that assembles the run; it does
not import ``models`` or ``input_pipelines``.
"""
