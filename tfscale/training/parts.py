"""What a run trains, handed to the trainer by the command that assembles it.

The trainer sits below what it trains: it does not import the model zoo (``models``) or the
input pipelines (``input_pipelines``). The command looks the chosen model and dataset up in
their registries (:func:`tfscale.cli.plugins.parts`) and gives the trainer these functions and
facts; a script or a test can give its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

    from tfscale.cluster.shard import Shard
    from tfscale.config.train_config import TrainConfig
    from tfscale.training.recompute import BlockRule


class Batches(Protocol):
    """A worker's batched dataset of one split, and how many examples it holds per epoch
    (None: unbounded)."""

    @property
    def dataset(self) -> tf.data.Dataset: ...

    @property
    def examples(self) -> int | None: ...


class Inference(Protocol):
    """How the model for inference preprocesses a raw image, as evaluation does: the export's
    (:func:`tfscale.training.export.export_inference`) arguments and description."""

    @property
    def task(self) -> str: ...

    @property
    def image_size(self) -> int: ...

    @property
    def classes(self) -> list[str] | None: ...

    @property
    def classes_from(self) -> str: ...

    @property
    def description(self) -> str: ...

    @property
    def dtype(self) -> Any: ...

    @property
    def channels(self) -> int: ...

    @property
    def preprocess(self) -> Callable[[Any], Any]: ...


@dataclasses.dataclass(frozen=True)
class Parts:
    """The model and dataset of a run.

    Attributes:
        model: builds the uncompiled model of a config.
        task: the model's task (``classification``, ``segmentation``).
        data: ``(config, shard, split, batch) -> Batches``, this worker's batches of a split.
        has_validation: whether the data has a validation split.
        reads_data: whether the dataset reads ``--data_dir`` (False: it generates its data).
        block_rule: the model's recomputation blocks, for ``--recompute`` (raises ValueError,
            naming the model, where it has none).
        inference: the inference preprocessing the dataset declares for a config, or None.
    """

    model: Callable[[TrainConfig], keras.Model]
    task: str
    data: Callable[[TrainConfig, Shard, str, int], Batches]
    has_validation: bool
    reads_data: bool
    block_rule: Callable[[], BlockRule]
    inference: Callable[[TrainConfig], Inference | None]
