"""Input pipelines registered by name (see :mod:`input_pipelines.registry`).

Importing the package imports no dataset module (nor TensorFlow): a pipeline's module is
imported when its builder is fetched from :data:`PIPELINES`.
"""

from input_pipelines.core.data_shape import shapes_from_data
from input_pipelines.registry import (
    PIPELINES,
    Batches,
    Shard,
    dataset_files,
    declare,
    has_validation_split,
    inference_for,
    reads_data_dir,
    recognize,
    register,
    task_of,
)

__all__ = ["PIPELINES", "Batches", "Shard", "dataset_files", "declare", "has_validation_split",
           "inference_for", "reads_data_dir", "recognize", "register", "shapes_from_data",
           "task_of"]
