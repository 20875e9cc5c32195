"""Input pipelines registered by name (see :mod:`input_pipelines.registry`).

The built-in pipelines are imported when :data:`PIPELINES` is first searched.
"""

from input_pipelines.registry import PIPELINES, Batches, Shard, register, task_of

__all__ = ["PIPELINES", "Batches", "Shard", "register", "task_of"]
