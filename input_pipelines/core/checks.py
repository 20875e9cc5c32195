"""The full up-front check of a worker's data when it is small.

Inside ``tf.data`` a bad record fails training with an error that does not name the file. So
when a worker's files total at most :data:`FULL_CHECK_BYTES`, the pipelines read all of them
once before training, in parallel, decoding every image and checking every label; the first
problem becomes a :class:`~input_pipelines.core.errors.DataError` naming the file and record. Larger
data gets the cheap checks only (paths, framing scan, manifest/stats label ranges, HDF5 shapes),
and assertions inside the pipeline as the last line of defence.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from input_pipelines.core.errors import CorruptFileError, DataError

FULL_CHECK_BYTES = 64 * 2**20
BATCH = 256

# element -> int64 [3]: the smallest and largest label of the element and its number of
# non-finite data values, computed from the decoded data (an op whose output is unused may be
# pruned from a tf.data function, and its error with it).
Check = Callable[..., tf.Tensor]


def label_error(where: str, low: int, high: int, num_classes: int) -> DataError | None:
    """The error for labels spanning ``[low, high]`` with ``num_classes`` classes, if any."""
    bad = low if low < 0 else high
    if 0 <= low and high < num_classes:
        return None
    hint = " (labels must start at 0)" if bad == num_classes else ""
    return DataError(f"{where}: label {bad} is outside [0, {num_classes}) "
                     f"(--num_classes={num_classes}){hint}")


def first_failure(dataset: tf.data.Dataset, check: Check, num_classes: int,
                  where: Callable[[int], str]) -> tuple[int, tf.errors.OpError] | None:
    """Runs ``check`` over ``dataset``; returns the index and error of the first element that
    fails to decode, or ``None``.

    Raises:
        DataError: an element's labels are outside ``[0, num_classes)``, or its data holds NaN
            or Inf; ``where(index)`` names it.
    """
    checked = dataset.map(check, num_parallel_calls=tf.data.AUTOTUNE, deterministic=True)
    done = 0
    try:
        for ranges in checked.batch(BATCH).as_numpy_iterator():
            _raise_labels(ranges, done, num_classes, where)
            done += len(ranges)
        return None
    except tf.errors.OpError:
        pass
    # Locate the failing element of the failed batch one element at a time.
    index = done
    try:
        for ranges in checked.skip(done).take(BATCH).as_numpy_iterator():
            _raise_labels(np.asarray([ranges]), index, num_classes, where)
            index += 1
    except tf.errors.OpError as err:
        return index, err
    raise RuntimeError("a batch failed to decode but none of its elements did")


def _raise_labels(ranges: np.ndarray, offset: int, num_classes: int,
                  where: Callable[[int], str]) -> None:
    bad = np.nonzero((ranges[:, 0] < 0) | (ranges[:, 1] >= num_classes) | (ranges[:, 2] > 0))[0]
    if len(bad):
        low, high, non_finite = (int(v) for v in ranges[bad[0]])
        name = where(offset + int(bad[0]))
        error = label_error(name, low, high, num_classes)
        if error is not None:
            raise error
        raise DataError(f"{name}: {non_finite} data values are NaN or Inf")


def first_line(err: tf.errors.OpError) -> str:
    """The meaningful part of a TensorFlow error message."""
    text = err.message.split("\n")[0]
    return text.split("}} ")[-1].split(" [Op:")[0].strip()


def check_tfrecords(paths: Sequence[str], sources: Sequence[str], check: Check,
                    num_classes: int, what: str) -> list[CorruptFileError]:
    """Reads every record of ``paths``; returns the files that fail their CRC.

    Args:
        paths: the files to read.
        sources: their names for messages (the originals of staged copies).
        check: record -> label range and non-finite count (see :data:`Check`).
        num_classes: labels must lie in ``[0, num_classes)``.
        what: what a record holds, for messages (e.g. ``"image"``).

    Raises:
        DataError: a record does not decode, or has a label out of range.
    """
    corrupt = []
    for path, source in zip(paths, sources, strict=True):
        failure = first_failure(tf.data.TFRecordDataset(path), check, num_classes,
                                functools.partial("{}: record {}".format, source))
        if failure is None:
            continue
        index, err = failure
        if isinstance(err, tf.errors.DataLossError):
            corrupt.append(CorruptFileError(source, f"corrupt TFRecord file: record {index} "
                                                    f"fails its CRC ({first_line(err)})"))
        else:
            raise DataError(f"{source}: record {index}: cannot decode the {what}: "
                            f"{first_line(err)}")
    return corrupt


def _offset_name(paths: Sequence[str], start: int, index: int) -> str:
    return paths[start + index]


def check_files(paths: Sequence[str], labels: Sequence[int], check: Check,
                num_classes: int) -> list[CorruptFileError]:
    """Decodes each of ``paths`` (one image per file); returns those that fail to decode.

    Raises:
        DataError: a label is out of range.
    """
    corrupt = []
    start = 0
    while start < len(paths):
        dataset = tf.data.Dataset.from_tensor_slices(
            (list(paths[start:]), tf.constant(list(labels[start:]), tf.int64)))
        failure = first_failure(dataset, check, num_classes,
                                functools.partial(_offset_name, paths, start))
        if failure is None:
            break
        index, err = failure
        corrupt.append(CorruptFileError(paths[start + index],
                                        f"cannot decode the image: {first_line(err)}"))
        start += index + 1
    return corrupt


def checked_labels(labels: tf.Tensor, num_classes: int) -> tf.Tensor:
    """``labels`` as int32, failing the pipeline if any is outside ``[0, num_classes)``.

    The last line of defence for data too large to check up front (a GPU loss would turn a bad
    label into NaN silently).
    """
    ok = tf.logical_and(tf.reduce_min(labels) >= 0, tf.reduce_max(labels) < num_classes)
    message = f"label outside [0, {num_classes}) (--num_classes={num_classes}); labels:"
    with tf.control_dependencies([tf.debugging.Assert(ok, [message, labels], summarize=8)]):
        return tf.cast(labels, tf.int32)


def non_finite(data: tf.Tensor) -> tf.Tensor:
    """int64 count of NaN/Inf values in ``data``."""
    finite = tf.math.is_finite(tf.cast(data, tf.float32))
    return tf.reduce_sum(tf.cast(tf.logical_not(finite), tf.int64))
