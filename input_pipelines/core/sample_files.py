"""Segmentation samples in HDF5 (``.h5``/``.hdf5``) or NumPy (``.npz``) files.

A file holds one sample (data ``H x W x C``, labels ``H x W``) or many (data ``N x H x W x C``,
labels ``N x H x W``) under two names, by default ``data`` and ``labels`` (climate-style: float
data of C channels, integer class per pixel). The rank of the labels tells which; data without a
channel axis has one channel. Each file is inspected from its metadata (no data read) and
samples are read one at a time through a small cache of open files.
"""

from __future__ import annotations

import collections
import dataclasses
import threading
import zipfile
from typing import Any

import h5py
import numpy as np

from input_pipelines.core.errors import CorruptFileError, DataError
from input_pipelines.core.files import split_files

H5_SUFFIXES = (".h5", ".hdf5")
NUMPY_SUFFIXES = (".npz",)
DATA_KEY = "data"
LABEL_KEY = "labels"
OPEN_FILES = 32


def h5_files(data_dir: str, split: str) -> list[str]:
    """The HDF5 files of ``split`` (``segmentation_h5``'s ``files=`` rule, see
    :mod:`input_pipelines.registry`).

    Raises:
        DataError: as :func:`input_pipelines.core.files.split_files`.
    """
    return split_files(data_dir, split, H5_SUFFIXES)


@dataclasses.dataclass(frozen=True)
class Layout:
    """What one file holds."""

    samples: int
    sample_shape: tuple[int, ...]  # H, W, C
    label_shape: tuple[int, ...]  # H, W
    batched: bool  # many samples (leading N axis)
    channel_axis: bool  # data has an explicit channel axis


class _OpenFiles:
    """A thread-safe cache of the last :data:`OPEN_FILES` opened files."""

    def __init__(self) -> None:
        self._files: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._lock = threading.Lock()

    def get(self, path: str, fresh: bool = False) -> Any:
        """The open file ``path``; ``fresh`` reopens it (it may have changed on disk)."""
        with self._lock:
            if fresh and path in self._files:
                self._close(self._files.pop(path))
            if path in self._files:
                self._files.move_to_end(path)
                return self._files[path]
            handle = _open(path)
            self._files[path] = handle
            if len(self._files) > OPEN_FILES:
                self._close(self._files.popitem(last=False)[1])
            return handle

    @staticmethod
    def _close(handle: Any) -> None:
        if isinstance(handle, h5py.File):
            handle.close()


_OPEN = _OpenFiles()


def _open(path: str) -> Any:
    try:
        if path.lower().endswith(NUMPY_SUFFIXES):
            with np.load(path, allow_pickle=False) as arrays:
                return {key: arrays[key] for key in arrays.files}
        return h5py.File(path, "r")
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise CorruptFileError(path, f"cannot open it: {err}") from None


def inspect(path: str, data_key: str = DATA_KEY, label_key: str = LABEL_KEY) -> Layout:
    """The :class:`Layout` of ``path`` from its metadata.

    Raises:
        CorruptFileError: the file cannot be opened.
        DataError: a name is missing, shapes are inconsistent, or labels are not integers.
    """
    handle = _OPEN.get(path, fresh=True)
    for key in (data_key, label_key):
        if key not in handle:
            raise DataError(f"{path} has no dataset {key!r}; it has: "
                            f"{', '.join(sorted(handle.keys()))}")
    data, labels = handle[data_key], handle[label_key]
    if not np.issubdtype(labels.dtype, np.integer):
        raise DataError(f"{path}: labels {label_key!r} are {labels.dtype}; expected integers")
    if not (np.issubdtype(data.dtype, np.floating) or np.issubdtype(data.dtype, np.integer)):
        raise DataError(f"{path}: data {data_key!r} is {data.dtype}; expected numbers")
    batched = labels.ndim == 3
    if labels.ndim not in (2, 3) or data.ndim - batched not in (2, 3):
        raise DataError(f"{path}: data {data.shape} and labels {labels.shape} are neither one "
                        "sample (H x W x C, H x W) nor many (N x H x W x C, N x H x W)")
    channel_axis = data.ndim - batched == 3
    sample_shape = tuple(data.shape[batched:]) + (() if channel_axis else (1,))
    label_shape = tuple(labels.shape[batched:])
    samples = labels.shape[0] if batched else 1
    if sample_shape[:2] != label_shape or (batched and data.shape[0] != samples):
        raise DataError(f"{path}: data {data.shape} and labels {labels.shape} do not match "
                        "(same samples, same height and width expected)")
    return Layout(samples, sample_shape, label_shape, batched, channel_axis)


def read_sample(path: str, index: int, layout: Layout, data_key: str = DATA_KEY,
                label_key: str = LABEL_KEY) -> tuple[np.ndarray, np.ndarray]:
    """Sample ``index`` of ``path`` as (float32 ``H x W x C``, int32 ``H x W``)."""
    handle = _OPEN.get(path)
    data, labels = handle[data_key], handle[label_key]
    if layout.batched:
        data, labels = data[index], labels[index]
    else:
        data, labels = data[()], labels[()]
    data = np.asarray(data, dtype=np.float32)
    if not layout.channel_axis:
        data = data[..., np.newaxis]
    return data, np.asarray(labels, dtype=np.int32)


def check_same_shapes(reference: str, ref_layout: Layout, path: str, layout: Layout) -> None:
    """Raises ``DataError`` unless ``path``'s samples have the shapes of ``reference``'s."""
    if (layout.sample_shape, layout.label_shape) != (ref_layout.sample_shape,
                                                     ref_layout.label_shape):
        raise DataError(f"{path}: samples have data shape {layout.sample_shape} and label shape "
                        f"{layout.label_shape}, but the first file {reference} has "
                        f"{ref_layout.sample_shape} and {ref_layout.label_shape}")
