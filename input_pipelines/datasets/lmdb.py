"""Classification from LMDB environments of Caffe ``Datum`` records (``--dataset=lmdb``).

Each value is a serialized ``Datum`` (:mod:`input_pipelines.core.datum`, decoded without Caffe):
an encoded image (JPEG, PNG ...; ``encoded`` set), as ``folder_to_lmdb`` and Caffe's
``convert_imageset --encoded`` write, or raw ``uint8`` pixels, channels first and BGR for
colour, as ``convert_imageset`` writes by default; the label is the Datum's. The layouts of
``--data_dir`` (``train/`` and ``validation/``, or Caffe's ``*train*_lmdb`` and ``*val*_lmdb``),
the per-worker key ranges and staging are those of :mod:`input_pipelines.core.lmdb_env`.

Each worker reads its key ranges in parallel (one generator per range, several ranges
interleaved) into the shared ``tf.data`` mechanics. A raw Datum becomes an image in the
pipeline (``CHW`` to ``HWC``, BGR to RGB) and is wrapped as an uncompressed PNG, so both kinds
take the preprocessing of the other image datasets unchanged (decoding, augmentation,
resizing to ``--image_size``, normalization with the manifest's pixel statistics, conversion to
``--input_channels``). Labels are checked against ``--num_classes`` from the manifest's label
range when there is one, and small data (``data.mdb`` up to
:data:`~input_pipelines.core.checks.FULL_CHECK_BYTES`) is decoded whole before training.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from itertools import accumulate
from typing import Any

import numpy as np
import tensorflow as tf

from input_pipelines.core import checks, mechanics
from input_pipelines.core.datum import Datum, DatumError, decode
from input_pipelines.core.errors import DataError
from input_pipelines.core.image_preprocessing import (
    classification_transform,
    decodes,
    run_preprocessing,
    validate_channels,
)
from input_pipelines.core.lmdb_env import DATA_FILE, KeyRanges, read_range, worker_ranges
from input_pipelines.registry import Batches, Shard
from tfscale.config.settings import DataSettings

# A block of records: (global indices, (image bytes, labels, raw shapes [C, H, W], zeros for an
# encoded image)); the generator hands over blocks because each call into Python costs far
# more than decoding a Datum.
SIGNATURE = (tf.TensorSpec([None], tf.int64), (tf.TensorSpec([None], tf.string),
                                               tf.TensorSpec([None], tf.int64),
                                               tf.TensorSpec([None, 3], tf.int32)))
BLOCK = 64  # records per block
RAW_CHANNELS = (1, 3)


def image_of(datum: Datum, where: str) -> tuple[bytes, int, tuple[int, int, int]]:
    """A Datum's image bytes, label and raw shape (``(0, 0, 0)`` when encoded).

    Raises:
        DataError: the Datum holds float data, or raw pixels of another channel count than 1
            or 3 (naming ``where``).
    """
    if datum.float_data:
        raise DataError(f"{where}: the Datum holds float_data ({len(datum.float_data)} values); "
                        "--dataset=lmdb reads images (raw uint8 or encoded)")
    if datum.encoded:
        return datum.data, datum.label, (0, 0, 0)
    if datum.channels not in RAW_CHANNELS:
        raise DataError(f"{where}: a raw Datum with {datum.channels} channels; --dataset=lmdb "
                        "reads 1 (grayscale) or 3 (BGR, as Caffe writes)")
    return datum.data, datum.label, (datum.channels, datum.height, datum.width)


def _image(ranges: KeyRanges, key: bytes,
           value: bytes | memoryview) -> tuple[bytes, int, tuple[int, int, int]]:
    """:func:`image_of` the record ``key``: ``value`` of ``ranges``' environment.

    Raises:
        DataError: the record is not a Datum, or not an image Datum (naming its key).
    """
    where = f"{ranges.source}: key {key.decode(errors='replace')}"
    try:
        return image_of(decode(value), where)
    except DatumError as err:
        raise DataError(f"{where}: not a Caffe Datum: {err}") from None


def _stacked(block: list[tuple[int, bytes, int, tuple[int, int, int]]]) -> tuple[Any, Any]:
    """A block of (index, image bytes, label, shape) as the arrays of :data:`SIGNATURE`."""
    indices, data, labels, shapes = zip(*block, strict=True)
    return np.array(indices, np.int64), (np.array(data, object), np.array(labels, np.int64),
                                         np.array(shapes, np.int32))


def reader(ranges: KeyRanges) -> mechanics.Reader:
    """A :data:`~input_pipelines.core.mechanics.Reader` of the named key ranges of ``ranges``."""

    def records(name: bytes, first: int, count: int) -> Iterator[tuple[Any, Any]]:
        start = ranges.starts[name.decode()]
        block: list[tuple[int, bytes, int, tuple[int, int, int]]] = []
        for index, key, value in read_range(ranges.environment, start, int(first), int(count)):
            block.append((index, *_image(ranges, key, value)))
            if len(block) == BLOCK:
                yield _stacked(block)
                block = []
        if block:
            yield _stacked(block)

    def read(name: tf.Tensor, first: tf.Tensor, count: tf.Tensor) -> tf.data.Dataset:
        return tf.data.Dataset.from_generator(records, output_signature=SIGNATURE,
                                              args=(name, first, count)).unbatch()

    return read


def parse(record: tuple[tf.Tensor, tf.Tensor, tf.Tensor]) -> tuple[tf.Tensor, tf.Tensor]:
    """(image bytes, label, raw shape) -> (encoded image, label)."""
    data, label, shape = record

    def raw() -> tf.Tensor:
        image = tf.transpose(tf.reshape(tf.io.decode_raw(data, tf.uint8), shape), [1, 2, 0])
        image = tf.cond(shape[0] == 3, lambda: tf.reverse(image, [2]), lambda: image)
        # Uncompressed: a copy of the pixels that the shared decoders read back exactly.
        return tf.io.encode_png(image, compression=0)

    return tf.cond(shape[0] > 0, raw, lambda: data), label


def _key_at(ranges: KeyRanges, position: int) -> str:
    """Names the record at ``position`` of the worker's ranges read in order."""
    for name, count in zip(ranges.names, ranges.counts, strict=True):
        if position < count:
            keys = [key for _, key, _ in read_range(ranges.environment, ranges.starts[name], 0,
                                                    position + 1)]
            return f"{ranges.source}: key {keys[-1].decode(errors='replace')}"
        position -= count
    return f"{ranges.source}: record {position}"


def check_labels(ranges: KeyRanges, num_classes: int) -> None:
    """Checks the manifest's label range of the environment against ``num_classes``.

    Raises:
        DataError: naming the environment when its labels do not fit.
    """
    if ranges.entry is not None and "label_min" in ranges.entry:
        error = checks.label_error(ranges.source, int(ranges.entry["label_min"]),
                                   int(ranges.entry["label_max"]), num_classes)
        if error is not None:
            raise error


def check_small(ranges: KeyRanges, read: mechanics.Reader, config: DataSettings) -> None:
    """Decodes every record of this worker's ranges when the environment is small (the Datums
    here, where an error can name the key; the images in ``tf.data``, as training will).

    Raises:
        DataError: a record is not a Datum, its image does not decode, or its label is out
            of range, naming its key.
    """
    if os.path.getsize(os.path.join(ranges.environment, DATA_FILE)) > checks.FULL_CHECK_BYTES:
        return
    for name, count in zip(ranges.names, ranges.counts, strict=True):
        for _, key, value in read_range(ranges.environment, ranges.starts[name], 0, count):
            _image(ranges, key, value)
    firsts = list(accumulate([0, *ranges.counts]))[:-1]
    table = (ranges.names, tf.constant(firsts, tf.int64), tf.constant(ranges.counts, tf.int64))
    records = tf.data.Dataset.from_tensor_slices(table).flat_map(read)
    channels = config.input_channels
    failure = checks.first_failure(
        records.map(lambda _, record: parse(record)),
        lambda encoded, label: decodes(encoded, label, channels), config.num_classes,
        lambda position: _key_at(ranges, position))
    if failure is not None:
        position, err = failure
        raise DataError(f"{_key_at(ranges, position)}: cannot decode the image: "
                        f"{checks.first_line(err)}")


def build(config: DataSettings, shard: Shard, split: str, batch_size: int) -> Batches:
    """The ``lmdb`` pipeline of worker ``shard`` (see the module docstring)."""
    validate_channels(config.input_channels, "lmdb")
    ranges = worker_ranges(config, shard, split)
    check_labels(ranges, config.num_classes)
    read = reader(ranges)
    check_small(ranges, read, config)
    transform = classification_transform(config, split,
                                         run_preprocessing(config, shard, split))
    return mechanics.batches(ranges.names, ranges.counts, read, parse, transform,
                             ranges.reading(config), shard, split, batch_size)
