"""The TFRecord form of a segmentation sample.

One ``tf.train.Example`` per sample: ``data`` (float32 ``H x W x C``, raw little-endian bytes),
``data/shape`` (int64 ``[H, W, C]``), ``labels`` (int32 ``H x W``, raw bytes) and
``labels/shape`` (int64 ``[H, W]``). Raw bytes keep the values exact and decode without a codec.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

FEATURES = {
    "data": tf.io.FixedLenFeature([], tf.string),
    "data/shape": tf.io.FixedLenFeature([3], tf.int64),
    "labels": tf.io.FixedLenFeature([], tf.string),
    "labels/shape": tf.io.FixedLenFeature([2], tf.int64),
}


def _bytes(value: bytes) -> tf.train.Feature:
    return tf.train.Feature(bytes_list=tf.train.BytesList(value=[value]))


def _ints(values: tuple[int, ...]) -> tf.train.Feature:
    return tf.train.Feature(int64_list=tf.train.Int64List(value=list(values)))


def encode(data: np.ndarray, labels: np.ndarray) -> bytes:
    """A serialized example of one sample (data ``H x W x C``, labels ``H x W``)."""
    data = np.ascontiguousarray(data, dtype="<f4")
    labels = np.ascontiguousarray(labels, dtype="<i4")
    example = tf.train.Example(features=tf.train.Features(feature={
        "data": _bytes(data.tobytes()),
        "data/shape": _ints(data.shape),
        "labels": _bytes(labels.tobytes()),
        "labels/shape": _ints(labels.shape),
    }))
    return example.SerializeToString(deterministic=True)  # the same bytes in every process


def decode(record: bytes) -> tuple[np.ndarray, np.ndarray]:
    """The inverse of :func:`encode`, in NumPy (for tools)."""
    feature = tf.train.Example.FromString(record).features.feature
    data = np.frombuffer(feature["data"].bytes_list.value[0], "<f4")
    labels = np.frombuffer(feature["labels"].bytes_list.value[0], "<i4")
    return (data.reshape(tuple(feature["data/shape"].int64_list.value)),
            labels.reshape(tuple(feature["labels/shape"].int64_list.value)))


def parse(record: tf.Tensor, sample_shape: tuple[int, ...]) -> tuple[tf.Tensor, tf.Tensor]:
    """A serialized example -> (float32 data, int32 labels) of the expected shapes.

    Raises (inside tf.data):
        InvalidArgumentError: the record's shapes differ from ``sample_shape``.
    """
    features = tf.io.parse_single_example(record, FEATURES)
    expected = tf.constant(sample_shape, tf.int64)
    same = tf.reduce_all(tf.equal(features["data/shape"], expected))
    message = f"segmentation record whose shape differs from {tuple(sample_shape)}:"
    with tf.control_dependencies([tf.debugging.Assert(same, [message, features["data/shape"]])]):
        data = tf.reshape(tf.io.decode_raw(features["data"], tf.float32), sample_shape)
        labels = tf.reshape(tf.io.decode_raw(features["labels"], tf.int32), sample_shape[:2])
    return data, labels
