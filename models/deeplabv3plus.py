"""DeepLabV3+ (Chen et al. 2018, "Encoder-Decoder with Atrous Separable Convolution for
Semantic Image Segmentation") on the ResNet-50 v1.5 trunk of :mod:`models.resnet50`.

Encoder: the trunk at output stride 16 (or 8), its last stages dilated instead of strided;
atrous spatial pyramid pooling (ASPP) on its ``conv5`` output: a 1x1 branch, three 3x3 branches
at rates 6/12/18 (doubled at output stride 8) and an image-level pooling branch, concatenated
and projected to 256 channels. Decoder: the ASPP output upsampled bilinearly to the ``conv2``
features (stride 4), concatenated with a 48-channel projection of them, two 3x3 convolutions,
a 1x1 classifier and a bilinear upsampling to the input resolution.

Upsampling resizes to the size of the tensor it is fused with, so any input of at least 32x32
works, square or not; sizes that are multiples of the output stride align the feature grids
exactly, other sizes are ceiling-divided by the strided layers and resized back (half-pixel
centres), which shifts boundaries by under one feature cell. The logits are computed and
upsampled in float32 under any mixed-precision policy.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import layers

from models.registry import ZERO_INIT_RESIDUAL
from models.resnet50 import block_of as trunk_block_of
from models.resnet50 import resnet50_features
from tfscale.config.settings import ModelSettings

ASPP_RATES = (6, 12, 18)  # at output stride 16; scaled by 16 / output_stride


@keras.saving.register_keras_serializable(package="tfscale")
class ResizeLike(layers.Layer):
    """Bilinearly resizes its first input to the height and width of its second."""

    def call(self, inputs: list[tf.Tensor]) -> tf.Tensor:
        x, reference = inputs
        size = tf.shape(reference)[1:3]
        # tf.image.resize returns float32 for any float input; keep the layer's compute dtype.
        return tf.cast(tf.image.resize(x, size, method="bilinear"), x.dtype)

    def compute_output_shape(
        self, input_shape: list[tuple[int | None, ...]]
    ) -> tuple[int | None, ...]:
        x_shape, reference_shape = input_shape
        return (x_shape[0], reference_shape[1], reference_shape[2], x_shape[3])


def conv_bn_relu(
    x: keras.KerasTensor, filters: int, kernel: int, name: str, dilation: int = 1
) -> keras.KerasTensor:
    """Convolution without bias (batch norm supplies it), batch norm and ReLU."""
    x = layers.Conv2D(
        filters, kernel, padding="same", dilation_rate=dilation, use_bias=False, name=f"{name}_conv"
    )(x)
    x = layers.BatchNormalization(name=f"{name}_bn")(x)
    return layers.Activation("relu", name=f"{name}_relu")(x)


def aspp(
    x: keras.KerasTensor, filters: int, output_stride: int, dropout: float = 0.1
) -> keras.KerasTensor:
    """Atrous spatial pyramid pooling with image-level features (DeepLabV3, section 3.3).

    Args:
        x: encoder features at ``output_stride``.
        filters: channels of every branch and of the projection.
        output_stride: 16 or 8; the atrous rates are 6/12/18 at 16 and twice that at 8.
        dropout: dropout rate after the projection.
    """
    scale = 16 // output_stride
    branches = [conv_bn_relu(x, filters, 1, "aspp_1x1")]
    for rate in ASPP_RATES:
        branches.append(
            conv_bn_relu(x, filters, 3, f"aspp_rate{rate * scale}", dilation=rate * scale)
        )
    pooled = layers.GlobalAveragePooling2D(keepdims=True, name="aspp_pool")(x)
    pooled = conv_bn_relu(pooled, filters, 1, "aspp_pool_proj")
    branches.append(ResizeLike(name="aspp_pool_resize")([pooled, x]))
    x = layers.Concatenate(name="aspp_concat")(branches)
    x = conv_bn_relu(x, filters, 1, "aspp_proj")
    return layers.Dropout(dropout, name="aspp_dropout")(x)


def deeplabv3plus(
    input_shape: tuple[int, int, int],
    num_classes: int,
    output_stride: int = 16,
    width: float = 1.0,
    aspp_filters: int = 256,
    low_level_filters: int = 48,
    decoder_filters: int = 256,
    zero_init_residual: bool = False,
) -> keras.Model:
    """DeepLabV3+ with a ResNet-50 v1.5 backbone, returning float32 logits ``[B, H, W, K]``.

    Args:
        input_shape: (height, width, channels) of the input; height and width >= 32.
        num_classes: classes per pixel (K).
        output_stride: 16 (the paper's training setting) or 8 (denser, slower).
        width: multiplier on the backbone's filters (1.0 = ResNet-50).
        aspp_filters: channels of the ASPP branches and projection (256 in the paper).
        low_level_filters: channels of the decoder's projection of ``conv2`` (48 in the paper).
        decoder_filters: channels of the decoder's 3x3 convolutions (256 in the paper).
        zero_init_residual: the backbone's bottlenecks start as their shortcuts.

    Raises:
        ValueError: for an output stride other than 8 or 16, or an input smaller than 32x32.
    """
    if output_stride not in (8, 16):
        raise ValueError(f"output_stride={output_stride}; DeepLabV3+ uses 8 or 16")
    if min(input_shape[:2]) < 32:
        raise ValueError(f"input_shape={input_shape}; height and width must be >= 32")
    inputs = keras.Input(shape=input_shape)
    features = resnet50_features(inputs, width, output_stride, zero_init_residual)
    x = aspp(features["conv5"], aspp_filters, output_stride)
    low_level = conv_bn_relu(features["conv2"], low_level_filters, 1, "decoder_low_level")
    x = ResizeLike(name="decoder_upsample")([x, low_level])
    x = layers.Concatenate(name="decoder_concat")([x, low_level])
    x = conv_bn_relu(x, decoder_filters, 3, "decoder_conv1")
    x = conv_bn_relu(x, decoder_filters, 3, "decoder_conv2")
    logits = layers.Conv2D(num_classes, 1, dtype="float32", name="logits")(x)
    outputs = ResizeLike(dtype="float32", name="logits_upsample")([logits, inputs])
    return keras.Model(inputs, outputs, name=f"deeplabv3plus_os{output_stride}")


def block_of(layer_name: str) -> str | None:
    """The blocks ``--recompute`` recomputes as one (:mod:`tfscale.training.recompute`): the trunk's
    (:func:`models.resnet50.block_of`), the ASPP (``aspp``) and the decoder up to its last
    3x3 convolution (``decoder``)."""
    for prefix in ("aspp", "decoder"):
        if layer_name.startswith(f"{prefix}_"):
            return prefix
    return trunk_block_of(layer_name)


def _shape(cfg: ModelSettings) -> tuple[int, int, int]:
    return (cfg.image_size, cfg.image_size, cfg.input_channels)


def build_deeplabv3plus(cfg: ModelSettings) -> keras.Model:
    return deeplabv3plus(_shape(cfg), cfg.num_classes, output_stride=16,
                         zero_init_residual=ZERO_INIT_RESIDUAL.of(cfg))


def build_deeplabv3plus_os8(cfg: ModelSettings) -> keras.Model:
    return deeplabv3plus(_shape(cfg), cfg.num_classes, output_stride=8,
                         zero_init_residual=ZERO_INIT_RESIDUAL.of(cfg))


def build_deeplabv3plus_tiny(cfg: ModelSettings) -> keras.Model:
    return deeplabv3plus(
        _shape(cfg),
        cfg.num_classes,
        output_stride=16,
        width=1 / 16,
        aspp_filters=16,
        low_level_filters=8,
        decoder_filters=16,
        zero_init_residual=ZERO_INIT_RESIDUAL.of(cfg),
    )
