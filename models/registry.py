"""Registry of model builders, and the built-in models.

A builder takes its :class:`~tfscale.config.settings.ModelSettings` (the data's shape and the
model's own options: it is not handed the rest of the run's configuration) and returns an
uncompiled ``keras.Model`` whose outputs are float32 logits: ``[B, num_classes]`` for
``task="classification"`` and ``[B, H, W, num_classes]`` for ``task="segmentation"`` (see
:mod:`tfscale.config.tasks`). Builders must keep the final logits in float32 under a
mixed-precision policy.

Your own model registers with the decorator::

    @models.register("my_net", "what it is, in one line", task="classification")
    def build_my_net(settings: ModelSettings) -> keras.Model: ...

with ``options=`` for flags of its own (:class:`tfscale.config.options.Option` declarations, or
``"module:attribute"`` naming them), as datasets have them; ``OPTION.of(settings)`` reads one.
``MODELS.get(name)`` returns the builder taking the run's ``TrainConfig`` (or settings) and
handing it ``ModelSettings.of(config, name)``.

The built-in models are declared below by name, builder (``"module:function"``), description
and task: their modules import Keras, which is loaded only when a builder is fetched, so
``--list``, a misspelt ``--model`` or a check of its task answer without TensorFlow.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from tfscale.config import options
from tfscale.config.options import Option
from tfscale.config.registry import Registry, TaskRegistry
from tfscale.config.settings import ModelSettings, hand
from tfscale.config.tasks import CLASSIFICATION, SEGMENTATION

if TYPE_CHECKING:
    import keras

    from tfscale.training.recompute import BlockRule

# Registered: (ModelSettings) -> Model; MODELS.get returns it taking a TrainConfig or settings.
ModelBuilder = Callable[..., "keras.Model"]

MODELS: TaskRegistry[ModelBuilder] = TaskRegistry("model", entry_point_group="tfscale.models",
                                                hand=hand(ModelSettings))
# The blocks --recompute recomputes as one, by model name (tfscale.training.recompute). Your own
# model
# adds its rule with ``@models.BLOCKS.register("my_net", "what its blocks are")``.
BLOCKS: Registry[BlockRule] = Registry("block rule")


# Registering checks the task (classification|segmentation); task_of reads it without importing.
register = MODELS.register_for
declare = MODELS.declare_for
# Each model's options (options=, as datasets have them), for the flags and configs.
options.add_source("model", lambda: (
    (entry.name, options.from_meta(entry.meta.get("options", ()))) for entry in MODELS))
task_of = MODELS.task_of


def block_rule(model: str) -> BlockRule:
    """The block rule of ``model`` for ``--recompute``.

    Raises:
        ValueError: naming the model and listing the models that have a rule.
    """
    if model not in BLOCKS:
        raise ValueError(f"--recompute needs a model with recomputation blocks; --model={model} "
                         f"has none (models with blocks: {', '.join(BLOCKS.names())})")
    return BLOCKS.get(model)


# Declared here, not beside the ResNet code, so that the flags are defined without Keras.
ZERO_INIT_RESIDUAL: Option[bool] = Option(
    "zero_init_residual", True,
    "Start the scale (gamma) of the last batch-norm layer of every residual block at 0, so "
    "that each block starts as the identity (Goyal et al. 2017, for large batches). On by "
    "default since bench.statistical_scaling measured it: resnet50_tiny on two small real "
    "datasets gained 7-26 points at global batches 64-256 (docs/STATISTICAL_SCALING.md); "
    "--nozero_init_residual starts them at 1, as Keras does.",
    changes_training=True)
RESIDUAL = {"options": (ZERO_INIT_RESIDUAL,)}

declare("resnet50", "models.resnet50:build_resnet50",
        "ResNet-50 v1.5 (stride on the 3x3 convolution)", CLASSIFICATION, **RESIDUAL)
declare("resnet50_tiny", "models.resnet50:build_resnet50_tiny",
        "ResNet-50 v1.5 layout with 1/16 of the filters, for tests", CLASSIFICATION, **RESIDUAL)
declare("tiny_cnn", "models.small:build_tiny_cnn",
        "2-conv CNN without batch norm, for tests", CLASSIFICATION)
declare("tiny_bn_cnn", "models.small:build_tiny_bn_cnn",
        "tiny_cnn with batch norm after each convolution, for tests", CLASSIFICATION)
declare("mlp", "models.small:build_mlp",
        "3-layer perceptron (communication-bound), for scaling tests", CLASSIFICATION)
declare("deeplabv3plus", "models.deeplabv3plus:build_deeplabv3plus",
        "DeepLabV3+ on ResNet-50, output stride 16", SEGMENTATION, **RESIDUAL)
declare("deeplabv3plus_os8", "models.deeplabv3plus:build_deeplabv3plus_os8",
        "DeepLabV3+ on ResNet-50, output stride 8 (ASPP rates 12/24/36)", SEGMENTATION, **RESIDUAL)
declare("deeplabv3plus_tiny", "models.deeplabv3plus:build_deeplabv3plus_tiny",
        "DeepLabV3+ layout with 1/16 of the filters, for tests", SEGMENTATION, **RESIDUAL)
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

for _name in ("resnet50", "resnet50_tiny"):
    BLOCKS.declare(_name, "models.resnet50:block_of", "each bottleneck, and the stem")
for _name in ("deeplabv3plus", "deeplabv3plus_os8", "deeplabv3plus_tiny"):
    BLOCKS.declare(_name, "models.deeplabv3plus:block_of",
                   "the trunk's bottlenecks and stem, the ASPP, the decoder")
for _name in ("tiramisu", "tiramisu56", "tiramisu67", "tiramisu103", "tiramisu_tiny"):
    BLOCKS.declare(_name, "models.tiramisu:block_of",
                   "each dense block (with its transition up), each transition down")
