"""Input pipelines registered by name (see :mod:`input_pipelines.registry`)."""

from input_pipelines import (  # noqa: F401  (imported to register their builders)
    image_folder,
    imagenet,
    segmentation_h5,
    segmentation_tfrecord,
    synthetic,
    synthetic_segmentation,
)
from input_pipelines.registry import PIPELINES, Batches, Shard, register, task_of

__all__ = ["PIPELINES", "Batches", "Shard", "register", "task_of"]
