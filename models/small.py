"""Small models for tests and communication-sensitive benchmarks."""

from __future__ import annotations

import keras
from keras import layers

from tfscale.config.settings import ModelSettings


def tiny_cnn(
    input_shape: tuple[int, int, int], num_classes: int, width: int = 8
) -> keras.Model:
    """Two convolutions, global pooling and a dense head; no batch normalization, so a step on
    a split batch equals a step on the whole batch (used by the strategy equivalence tests)."""
    inputs = keras.Input(shape=input_shape)
    x = layers.Conv2D(width, 3, strides=2, padding="same", activation="relu")(inputs)
    x = layers.Conv2D(2 * width, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(num_classes, dtype="float32")(x)
    return keras.Model(inputs, outputs, name="tiny_cnn")


def tiny_bn_cnn(
    input_shape: tuple[int, int, int], num_classes: int, width: int = 8
) -> keras.Model:
    """:func:`tiny_cnn` with batch normalization after each convolution: the smallest model
    whose inference depends on batch-norm statistics (their tests)."""
    inputs = keras.Input(shape=input_shape)
    x = inputs
    for i, filters in enumerate((width, 2 * width)):
        x = layers.Conv2D(filters, 3, strides=2, padding="same", use_bias=False,
                          name=f"conv{i + 1}")(x)
        x = layers.BatchNormalization(name=f"bn{i + 1}")(x)
        x = layers.ReLU(name=f"relu{i + 1}")(x)
    x = layers.GlobalAveragePooling2D()(x)
    outputs = layers.Dense(num_classes, dtype="float32")(x)
    return keras.Model(inputs, outputs, name="tiny_bn_cnn")


def mlp(input_shape: tuple[int, int, int], num_classes: int, width: int = 512) -> keras.Model:
    """A flat multi-layer perceptron: many parameters per FLOP, so it is communication-bound."""
    inputs = keras.Input(shape=input_shape)
    x = layers.Flatten()(inputs)
    x = layers.Dense(width, activation="relu")(x)
    x = layers.Dense(width, activation="relu")(x)
    outputs = layers.Dense(num_classes, dtype="float32")(x)
    return keras.Model(inputs, outputs, name="mlp")


def _shape(cfg: ModelSettings) -> tuple[int, int, int]:
    return (cfg.image_size, cfg.image_size, cfg.input_channels)


def build_tiny_cnn(cfg: ModelSettings) -> keras.Model:
    return tiny_cnn(_shape(cfg), cfg.num_classes)


def build_tiny_bn_cnn(cfg: ModelSettings) -> keras.Model:
    return tiny_bn_cnn(_shape(cfg), cfg.num_classes)


def build_mlp(cfg: ModelSettings) -> keras.Model:
    return mlp(_shape(cfg), cfg.num_classes)
