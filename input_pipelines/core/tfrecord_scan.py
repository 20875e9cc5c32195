"""A fast framing scan of TFRecord files, to name a truncated or damaged file up front.

A TFRecord file is a sequence of records, each ``uint64 length | uint32 masked CRC-32C of the
length | data | uint32 masked CRC-32C of the data`` (little-endian). Inside ``tf.data`` a damaged
file surfaces as ``DataLossError: corrupted record at 12`` without the file's name, so the
pipelines scan each file first: the scan reads 12 bytes per record and seeks over the data,
checking each length's CRC and that every record ends inside the file. It counts the records on
the way. A damaged payload with an intact frame is found by the full check of small data
(:mod:`input_pipelines.core.checks`) or the staging checksums (:mod:`input_pipelines.core.staging`).
"""

from __future__ import annotations

import os
import struct
from collections.abc import Sequence

from input_pipelines.core.errors import CorruptFileError

_CASTAGNOLI = 0x82F63B78  # reversed CRC-32C polynomial
_MASK_DELTA = 0xA282EAD8
_HEADER = struct.Struct("<QI")


def _crc_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ _CASTAGNOLI if crc & 1 else crc >> 1
        table.append(crc)
    return tuple(table)


_TABLE = _crc_table()


def crc32c(data: bytes) -> int:
    """CRC-32C (Castagnoli) of ``data``; meant for short inputs such as record headers."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _TABLE[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data: bytes) -> int:
    """The masked CRC-32C that TFRecord stores (rotated right by 15 bits, plus a constant)."""
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & 0xFFFFFFFF


def scan_tfrecord(path: str) -> int:
    """Checks the framing of the TFRecord file ``path`` and returns its number of records.

    Raises:
        CorruptFileError: a header fails its CRC, or the file ends inside a record.
    """
    size = os.path.getsize(path)
    records = position = 0
    with open(path, "rb") as f:
        while position < size:
            header = f.read(_HEADER.size)
            if len(header) < _HEADER.size:
                raise CorruptFileError(path, f"truncated TFRecord file: {size} bytes end inside "
                                             f"the header of record {records}")
            length, crc = _HEADER.unpack(header)
            if masked_crc32c(header[:8]) != crc:
                raise CorruptFileError(path, f"corrupt TFRecord file: the header of record "
                                             f"{records} at byte {position} fails its CRC")
            end = position + _HEADER.size + length + 4
            if end > size:
                raise CorruptFileError(path, f"truncated TFRecord file: record {records} needs "
                                             f"{end} bytes but the file has {size}")
            f.seek(end)
            position = end
            records += 1
    return records


def scan_all(paths: Sequence[str], skip_corrupt: bool) -> tuple[list[str], list[int],
                                                              list[CorruptFileError]]:
    """Scans ``paths``; returns the good files, their record counts and the corrupt ones.

    Raises:
        CorruptFileError: the first corrupt file, unless ``skip_corrupt``.
    """
    good: list[str] = []
    counts: list[int] = []
    bad: list[CorruptFileError] = []
    for path in paths:
        try:
            counts.append(scan_tfrecord(path))
            good.append(path)
        except CorruptFileError as err:
            if not skip_corrupt:
                raise
            bad.append(err)
    return good, counts, bad
