"""Caffe's ``Datum`` record, read and written without Caffe (nor its generated protobuf code).

Caffe's ``convert_imageset`` stores each image of an LMDB dataset as a serialized ``Datum``;
``src/caffe/proto/caffe.proto`` declares (proto2)::

    message Datum {
      optional int32 channels = 1;
      optional int32 height = 2;
      optional int32 width = 3;
      optional bytes data = 4;            // raw pixels, uint8 CHW, or the encoded file
      optional int32 label = 5;
      repeated float float_data = 6;      // optionally, the datum can hold float data
      optional bool encoded = 7 [default = false];  // data holds an encoded image
    }

A raw Datum's ``data`` is ``channels x height x width`` bytes, channels first, and in OpenCV's
order: a colour image is BGR (``CVMatToDatum`` copies ``cv::imread``'s pixels). An encoded one
holds the image file's bytes (JPEG, PNG ...) with ``encoded`` set and usually no shape.

The protobuf wire format needed here: each field is a varint key ``number << 3 | wire type``,
then a varint (type 0), 8 bytes (type 1), a varint length and that many bytes (type 2), or
4 bytes (type 5). Unknown fields are skipped, as protobuf does; ``float_data`` is read packed
or not. :func:`encode` writes the fields in number order, as Caffe's C++ serializer does, so a
record written here is byte for byte what Caffe writes for the same image.
"""

from __future__ import annotations

import dataclasses
import struct

CHANNELS, HEIGHT, WIDTH, DATA, LABEL, FLOAT_DATA, ENCODED = range(1, 8)
VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5
_FLOAT = struct.Struct("<f")


class DatumError(ValueError):
    """A record is not a valid serialized ``Datum``."""


@dataclasses.dataclass(frozen=True)
class Datum:
    """One decoded ``Datum``; fields left out of the record keep proto2's defaults."""

    data: bytes = b""
    label: int = 0
    channels: int = 0
    height: int = 0
    width: int = 0
    encoded: bool = False
    float_data: tuple[float, ...] = ()


def caffe_key(index: int, name: str) -> bytes:
    """The key ``convert_imageset`` gives the ``index``-th image of its list, ``name``: the
    index as 8 zero-padded digits, ``_``, the file name (so keys sort in list order)."""
    return f"{index:08d}_{name}".encode()


def _varint(value: int) -> bytes:
    """``value`` as a protobuf varint; a negative int32 takes ten bytes (two's complement)."""
    value &= (1 << 64) - 1
    out = bytearray()
    while True:
        byte = value & 0x7F
        value >>= 7
        if value:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


def _read_varint(buffer: bytes | memoryview, position: int) -> tuple[int, int]:
    """The varint at ``position`` and the position after it."""
    result = shift = 0
    while True:
        if position >= len(buffer):
            raise DatumError("the record ends inside a varint")
        byte = buffer[position]
        position += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, position
        shift += 7
        if shift >= 70:
            raise DatumError("a varint is longer than ten bytes")


def _int32(value: int) -> int:
    """A decoded varint as protobuf's int32 (negative values were sign-extended to 64 bits)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value & 0x80000000 else value


def _key(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def encode(datum: Datum) -> bytes:
    """``datum`` serialized as Caffe serializes it (see the module docstring).

    A raw datum (``encoded`` false) writes its shape and an explicit ``encoded: false``, as
    ``CVMatToDatum`` sets them; an encoded one writes only ``data``, ``label`` and ``encoded``,
    as ``ReadFileToDatum`` does.
    """
    out = bytearray()
    if not datum.encoded:
        for number, value in ((CHANNELS, datum.channels), (HEIGHT, datum.height),
                              (WIDTH, datum.width)):
            out += _key(number, VARINT) + _varint(value)
    out += _key(DATA, LENGTH) + _varint(len(datum.data)) + datum.data
    out += _key(LABEL, VARINT) + _varint(datum.label)
    for element in datum.float_data:
        out += _key(FLOAT_DATA, FIXED32) + _FLOAT.pack(element)
    out += _key(ENCODED, VARINT) + _varint(int(datum.encoded))
    return bytes(out)


def decode(record: bytes | memoryview) -> Datum:
    """The ``Datum`` serialized in ``record``.

    Raises:
        DatumError: the record is not a valid protobuf message, or a raw datum's ``data``
            does not hold ``channels x height x width`` bytes.
    """
    fields: dict[int, int | bytes] = {}
    floats: list[float] = []
    position, end = 0, len(record)
    while position < end:
        key, position = _read_varint(record, position)
        number, wire_type = key >> 3, key & 7
        if wire_type == VARINT:
            value, position = _read_varint(record, position)
            fields[number] = value
        elif wire_type == LENGTH:
            length, position = _read_varint(record, position)
            if position + length > end:
                raise DatumError(f"field {number} needs {length} bytes but the record has "
                                 f"{end - position} left")
            chunk = bytes(record[position:position + length])
            position += length
            if number == FLOAT_DATA:  # packed repeated float
                if length % 4:
                    raise DatumError(f"packed float_data of {length} bytes is not whole floats")
                floats += [v for (v,) in _FLOAT.iter_unpack(chunk)]
            else:
                fields[number] = chunk
        elif wire_type in (FIXED32, FIXED64):
            size = 4 if wire_type == FIXED32 else 8
            if position + size > end:
                raise DatumError(f"the record ends inside field {number}")
            if number == FLOAT_DATA and wire_type == FIXED32:
                floats.append(_FLOAT.unpack_from(record, position)[0])
            position += size
        else:
            raise DatumError(f"field {number} has wire type {wire_type}, which a Datum never "
                             "holds (is this a Caffe Datum?)")
    data = fields.get(DATA, b"")
    if not isinstance(data, bytes) or any(
            isinstance(fields.get(n), bytes) for n in (CHANNELS, HEIGHT, WIDTH, LABEL, ENCODED)):
        raise DatumError("a field has the wrong wire type for a Datum (is this a Caffe Datum?)")
    datum = Datum(data=data, label=_int32(int(fields.get(LABEL, 0))),
                  channels=_int32(int(fields.get(CHANNELS, 0))),
                  height=_int32(int(fields.get(HEIGHT, 0))),
                  width=_int32(int(fields.get(WIDTH, 0))),
                  encoded=bool(fields.get(ENCODED, 0)), float_data=tuple(floats))
    if not datum.encoded and not datum.float_data:
        expected = datum.channels * datum.height * datum.width
        if expected <= 0 or len(datum.data) != expected:
            raise DatumError(f"a raw Datum of shape {datum.channels}x{datum.height}x"
                             f"{datum.width} holds {len(datum.data)} data bytes")
    return datum
