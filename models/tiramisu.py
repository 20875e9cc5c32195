"""FC-DenseNet, "the one hundred layers Tiramisu" (Jégou et al. 2017).

A 3x3 convolution of 48 filters, then a downsampling path of dense blocks, each followed by a
transition down (batch norm, ReLU, 1x1 convolution, dropout, 2x2 max-pooling), a bottleneck
dense block, and an upsampling path mirroring the downsampling one: a transition up (3x3
transposed convolution, stride 2) of only the feature maps the previous dense block created,
concatenated with the skip connection of the same resolution, then a dense block. A dense block
layer is batch norm, ReLU, 3x3 convolution of ``growth`` filters and dropout, and its output is
concatenated to its input. A 1x1 convolution maps the last block's full stack to float32 logits.

Pooling uses "same" padding and each upsampled map is cropped to its skip connection, so any
input of at least 1x1, square or not, comes back at its own resolution (multiples of
``2 ** len(down_layers)`` need no cropping).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import keras
from keras import layers

from tfscale.config.settings import ModelSettings

FIRST_FILTERS = 48
# Layers per dense block of the downsampling path, then the bottleneck, and the growth rate
# (Jégou et al., table 2 and section 4).
CONFIGS: dict[str, tuple[tuple[int, ...], int, int]] = {
    "tiramisu56": ((4, 4, 4, 4, 4), 4, 12),
    "tiramisu67": ((5, 5, 5, 5, 5), 5, 16),
    "tiramisu103": ((4, 5, 7, 10, 12), 15, 16),
}
PAPER_PARAMS = {"tiramisu56": 1.5e6, "tiramisu67": 3.5e6, "tiramisu103": 9.4e6}


def _bn_relu_conv(
    x: keras.KerasTensor, filters: int, kernel: int, dropout: float, name: str
) -> keras.KerasTensor:
    x = layers.BatchNormalization(name=f"{name}_bn")(x)
    x = layers.Activation("relu", name=f"{name}_relu")(x)
    x = layers.Conv2D(
        filters, kernel, padding="same", kernel_initializer="he_uniform", name=f"{name}_conv"
    )(x)
    return layers.Dropout(dropout, name=f"{name}_dropout")(x) if dropout else x


def dense_block(
    x: keras.KerasTensor, num_layers: int, growth: int, dropout: float, name: str
) -> tuple[keras.KerasTensor, keras.KerasTensor]:
    """A dense block.

    Returns:
        The block's input concatenated with every new feature map, and the new feature maps
        alone (``num_layers * growth`` channels).
    """
    new: list[keras.KerasTensor] = []
    for i in range(num_layers):
        out = _bn_relu_conv(x, growth, 3, dropout, f"{name}_layer{i + 1}")
        new.append(out)
        x = layers.Concatenate(name=f"{name}_concat{i + 1}")([x, out])
    created = new[0] if len(new) == 1 else layers.Concatenate(name=f"{name}_new")(new)
    return x, created


def transition_down(x: keras.KerasTensor, dropout: float, name: str) -> keras.KerasTensor:
    """BN, ReLU, 1x1 convolution keeping the channels, dropout, 2x2 max-pooling."""
    x = _bn_relu_conv(x, x.shape[-1], 1, dropout, name)
    return layers.MaxPooling2D(2, padding="same", name=f"{name}_pool")(x)


def transition_up(x: keras.KerasTensor, skip: keras.KerasTensor, name: str) -> keras.KerasTensor:
    """3x3 transposed convolution (stride 2) of ``x``, cropped to ``skip`` and concatenated."""
    x = layers.Conv2DTranspose(
        x.shape[-1],
        3,
        strides=2,
        padding="same",
        kernel_initializer="he_uniform",
        name=f"{name}_deconv",
    )(x)
    extra_h, extra_w = x.shape[1] - skip.shape[1], x.shape[2] - skip.shape[2]
    if extra_h or extra_w:
        x = layers.Cropping2D(((0, extra_h), (0, extra_w)), name=f"{name}_crop")(x)
    return layers.Concatenate(name=f"{name}_concat")([x, skip])


def tiramisu(
    input_shape: tuple[int, int, int],
    num_classes: int,
    down_layers: Sequence[int] = CONFIGS["tiramisu103"][0],
    bottleneck_layers: int = CONFIGS["tiramisu103"][1],
    growth: int = CONFIGS["tiramisu103"][2],
    first_filters: int = FIRST_FILTERS,
    dropout: float = 0.2,
    name: str = "tiramisu",
) -> keras.Model:
    """An FC-DenseNet returning float32 logits ``[B, H, W, num_classes]``.

    Args:
        input_shape: (height, width, channels); height and width need not be equal.
        num_classes: classes per pixel.
        down_layers: layers of each dense block of the downsampling path; the upsampling path
            mirrors it.
        bottleneck_layers: layers of the dense block at the lowest resolution.
        growth: feature maps each dense block layer adds.
        first_filters: filters of the first 3x3 convolution (48 in the paper).
        dropout: dropout rate after every convolution (0.2 in the paper).
        name: the model's name.

    Raises:
        ValueError: for an empty downsampling path or a non-positive layer count.
    """
    if not down_layers or min(*down_layers, bottleneck_layers) < 1:
        raise ValueError(
            f"down_layers={tuple(down_layers)}, bottleneck_layers="
            f"{bottleneck_layers}; every dense block needs at least one layer"
        )
    inputs = keras.Input(shape=input_shape)
    x = layers.Conv2D(
        first_filters, 3, padding="same", kernel_initializer="he_uniform", name="first_conv"
    )(inputs)
    skips = []
    for i, count in enumerate(down_layers, start=1):
        x, _ = dense_block(x, count, growth, dropout, f"down{i}")
        skips.append(x)
        x = transition_down(x, dropout, f"td{i}")
    _, to_upsample = dense_block(x, bottleneck_layers, growth, dropout, "bottleneck")
    for i, (count, skip) in enumerate(
        zip(reversed(down_layers), reversed(skips), strict=True), start=1
    ):
        x = transition_up(to_upsample, skip, f"tu{i}")
        stack, to_upsample = dense_block(x, count, growth, dropout, f"up{i}")
    outputs = layers.Conv2D(num_classes, 1, dtype="float32", name="logits")(stack)
    return keras.Model(inputs, outputs, name=name)


def block_of(layer_name: str) -> str | None:
    """The blocks ``--recompute`` recomputes as one (:mod:`tfscale.training.recompute`): each dense
    block
    of the downsampling path (``down1``, ...) and each transition down (``td1``, ...), the
    bottleneck block, and each transition up with the dense block after it (``up1``, ...)."""
    found = re.match(r"(down\d+|td\d+|bottleneck|up\d+|tu\d+)_", layer_name)
    return found.group(1).replace("tu", "up") if found else None


def _build(name: str, cfg: ModelSettings) -> keras.Model:
    down, bottleneck, growth = CONFIGS[name]
    return tiramisu(
        (cfg.image_size, cfg.image_size, cfg.input_channels),
        cfg.num_classes,
        down,
        bottleneck,
        growth,
        name=name,
    )


def build_tiramisu(cfg: ModelSettings) -> keras.Model:
    return _build("tiramisu103", cfg)


def build_tiramisu56(cfg: ModelSettings) -> keras.Model:
    return _build("tiramisu56", cfg)


def build_tiramisu67(cfg: ModelSettings) -> keras.Model:
    return _build("tiramisu67", cfg)


def build_tiramisu103(cfg: ModelSettings) -> keras.Model:
    return _build("tiramisu103", cfg)


def build_tiramisu_tiny(cfg: ModelSettings) -> keras.Model:
    return tiramisu(
        (cfg.image_size, cfg.image_size, cfg.input_channels),
        cfg.num_classes,
        (2, 2, 2),
        2,
        4,
        first_filters=8,
        name="tiramisu_tiny",
    )
