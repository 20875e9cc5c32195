"""Input pipelines registered by name (see :mod:`input_pipelines.registry`)."""

from input_pipelines import synthetic  # noqa: F401  (imported to register its builders)
from input_pipelines.registry import PIPELINES, Batches, Shard, register, task_of

__all__ = ["PIPELINES", "Batches", "Shard", "register", "task_of"]
