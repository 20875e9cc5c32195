"""Registry of model builders, and the built-in models.

A builder takes the run's :class:`~tfscale.config.TrainConfig` and returns an uncompiled
``keras.Model`` whose outputs are float32 probabilities-free logits: ``[B, num_classes]`` for
``task="classification"`` and ``[B, H, W, num_classes]`` for ``task="segmentation"`` (see
:mod:`tfscale.tasks`). Builders must keep the final logits in float32 under a mixed-precision
policy.

Your own model registers with the decorator::

    @models.register("my_net", "what it is, in one line", task="classification")
    def build_my_net(cfg: TrainConfig) -> keras.Model: ...

The built-in models are declared below by name, builder (``"module:function"``), description
and task: their modules import Keras, which is loaded only when a builder is fetched, so
``--list``, a misspelt ``--model`` or a check of its task answer without TensorFlow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tfscale.registry import TaskRegistry
from tfscale.tasks import CLASSIFICATION, SEGMENTATION

if TYPE_CHECKING:
    import keras

    from tfscale.config import TrainConfig

ModelBuilder = Callable[["TrainConfig"], "keras.Model"]

MODELS: TaskRegistry[ModelBuilder] = TaskRegistry("model", entry_point_group="tfscale.models")


# Registering checks the task (classification|segmentation); task_of reads it without importing.
register = MODELS.register_for
declare = MODELS.declare_for
task_of = MODELS.task_of


declare("resnet50", "models.resnet50:build_resnet50",
        "ResNet-50 v1.5 (stride on the 3x3 convolution)", CLASSIFICATION)
declare("resnet50_tiny", "models.resnet50:build_resnet50_tiny",
        "ResNet-50 v1.5 layout with 1/16 of the filters, for tests", CLASSIFICATION)
declare("tiny_cnn", "models.small:build_tiny_cnn",
        "2-conv CNN without batch norm, for tests", CLASSIFICATION)
declare("mlp", "models.small:build_mlp",
        "3-layer perceptron (communication-bound), for scaling tests", CLASSIFICATION)
declare("deeplabv3plus", "models.deeplabv3plus:build_deeplabv3plus",
        "DeepLabV3+ on ResNet-50, output stride 16", SEGMENTATION)
declare("deeplabv3plus_os8", "models.deeplabv3plus:build_deeplabv3plus_os8",
        "DeepLabV3+ on ResNet-50, output stride 8 (ASPP rates 12/24/36)", SEGMENTATION)
declare("deeplabv3plus_tiny", "models.deeplabv3plus:build_deeplabv3plus_tiny",
        "DeepLabV3+ layout with 1/16 of the filters, for tests", SEGMENTATION)
declare("tiramisu", "models.tiramisu:build_tiramisu",
        "FC-DenseNet103 (the one hundred layers Tiramisu)", SEGMENTATION)
declare("tiramisu56", "models.tiramisu:build_tiramisu56",
        "FC-DenseNet56: 4 layers per block, growth 12", SEGMENTATION)
declare("tiramisu67", "models.tiramisu:build_tiramisu67",
        "FC-DenseNet67: 5 layers per block, growth 16", SEGMENTATION)
declare("tiramisu103", "models.tiramisu:build_tiramisu103",
        "FC-DenseNet103: blocks 4,5,7,10,12,15, growth 16", SEGMENTATION)
declare("tiramisu_tiny", "models.tiramisu:build_tiramisu_tiny",
        "FC-DenseNet with 3 levels of 2-layer blocks, growth 4, for tests", SEGMENTATION)
