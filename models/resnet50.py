"""ResNet-50 v1.5 (He et al. 2016, with the stride of each downsampling bottleneck on its 3x3
convolution instead of the first 1x1, as in NVIDIA's and MLPerf's reference "v1.5").

Layer for layer it has the parameters of ``keras.applications.ResNet50`` (convolutions with
biases, batch-norm epsilon 1.001e-5), so the counts are equal; only where the stride sits
differs. Works for any input size >= 32 and any number of input channels.
"""

from __future__ import annotations

import re

import keras
from keras import layers

from models.registry import ZERO_INIT_RESIDUAL
from tfscale.config.settings import ModelSettings

_BN_EPS = 1.001e-5
STAGES = ((64, 3, 1), (128, 4, 2), (256, 6, 2), (512, 3, 2))  # (filters, blocks, first stride)


def _bn(x: keras.KerasTensor, name: str, zero: bool = False) -> keras.KerasTensor:
    return layers.BatchNormalization(axis=-1, epsilon=_BN_EPS, name=name,
                                     gamma_initializer="zeros" if zero else "ones")(x)


def bottleneck(
    x: keras.KerasTensor, filters: int, stride: int, project: bool, name: str,
    dilation: int = 1, zero_init_residual: bool = False,
) -> keras.KerasTensor:
    """One v1.5 bottleneck: 1x1 -> 3x3 (strided, optionally dilated) -> 1x1 (4x filters);
    with ``zero_init_residual`` its last batch norm's scale starts at 0 (the block starts as
    its shortcut)."""
    shortcut = x
    if project:
        shortcut = layers.Conv2D(4 * filters, 1, strides=stride, name=f"{name}_0_conv")(x)
        shortcut = _bn(shortcut, f"{name}_0_bn")
    x = layers.Conv2D(filters, 1, name=f"{name}_1_conv")(x)
    x = layers.Activation("relu", name=f"{name}_1_relu")(_bn(x, f"{name}_1_bn"))
    x = layers.Conv2D(filters, 3, strides=stride, padding="same", dilation_rate=dilation,
                      name=f"{name}_2_conv")(x)
    x = layers.Activation("relu", name=f"{name}_2_relu")(_bn(x, f"{name}_2_bn"))
    x = layers.Conv2D(4 * filters, 1, name=f"{name}_3_conv")(x)
    x = _bn(x, f"{name}_3_bn", zero=zero_init_residual)
    x = layers.Add(name=f"{name}_add")([shortcut, x])
    return layers.Activation("relu", name=f"{name}_out")(x)


def stem(inputs: keras.KerasTensor) -> keras.KerasTensor:
    """7x7/2 convolution and 3x3/2 max-pool: output stride 4."""
    x = layers.ZeroPadding2D(3, name="conv1_pad")(inputs)
    x = layers.Conv2D(64, 7, strides=2, name="conv1_conv")(x)
    x = layers.Activation("relu", name="conv1_relu")(_bn(x, "conv1_bn"))
    x = layers.ZeroPadding2D(1, name="pool1_pad")(x)
    return layers.MaxPooling2D(3, strides=2, name="pool1_pool")(x)


def resnet50_features(
    inputs: keras.KerasTensor, width: float = 1.0, output_stride: int = 32,
    zero_init_residual: bool = False,
) -> dict[str, keras.KerasTensor]:
    """The ResNet-50 trunk; returns each stage's output by name (``conv2`` ... ``conv5``).

    Args:
        inputs: image tensor.
        width: multiplier on every stage's filters (1.0 = the published network).
        output_stride: 32 (classification), or 16/8 for dense prediction: the later stages keep
            their resolution and dilate their 3x3 convolutions instead (atrous convolution).
        zero_init_residual: each bottleneck's last batch-norm scale starts at 0.

    Raises:
        ValueError: for an output stride other than 8, 16 or 32.
    """
    if output_stride not in (8, 16, 32):
        raise ValueError(f"output_stride={output_stride}; expected 8, 16 or 32")
    x = stem(inputs)
    features: dict[str, keras.KerasTensor] = {}
    current_stride, dilation = 4, 1
    for stage, (filters, blocks, stride) in enumerate(STAGES, start=2):
        filters = max(1, int(filters * width))
        if stride > 1 and current_stride >= output_stride:
            dilation *= stride
            stride = 1
        else:
            current_stride *= stride
        for block in range(blocks):
            x = bottleneck(x, filters, stride if block == 0 else 1, project=block == 0,
                           name=f"conv{stage}_block{block + 1}", dilation=dilation,
                           zero_init_residual=zero_init_residual)
        features[f"conv{stage}"] = x
    return features


def resnet50(
    input_shape: tuple[int, int, int] = (224, 224, 3), num_classes: int = 1000,
    width: float = 1.0, zero_init_residual: bool = False,
) -> keras.Model:
    """ResNet-50 v1.5 classifier returning float32 logits."""
    inputs = keras.Input(shape=input_shape)
    x = resnet50_features(inputs, width, zero_init_residual=zero_init_residual)["conv5"]
    x = layers.GlobalAveragePooling2D(name="avg_pool")(x)
    outputs = layers.Dense(num_classes, dtype="float32", name="predictions")(x)
    return keras.Model(inputs, outputs, name="resnet50_v1_5")


def block_of(layer_name: str) -> str | None:
    """The blocks ``--recompute`` recomputes as one (:mod:`tfscale.training.recompute`): each
    bottleneck
    (``conv3_block2``, ...) and the stem (``stem``)."""
    if layer_name.startswith(("conv1_", "pool1_")):
        return "stem"
    bottleneck_block = re.match(r"(conv\d+_block\d+)_", layer_name)
    return bottleneck_block.group(1) if bottleneck_block else None


def build_resnet50(cfg: ModelSettings) -> keras.Model:
    return resnet50((cfg.image_size, cfg.image_size, cfg.input_channels), cfg.num_classes,
                    zero_init_residual=ZERO_INIT_RESIDUAL.of(cfg))


def build_resnet50_tiny(cfg: ModelSettings) -> keras.Model:
    return resnet50((cfg.image_size, cfg.image_size, cfg.input_channels), cfg.num_classes,
                    width=1 / 16, zero_init_residual=ZERO_INIT_RESIDUAL.of(cfg))
