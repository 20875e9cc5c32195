"""Errors raised for bad input data. Each is a ``ValueError`` whose message names the file
or value, so the trainer's entry point reports it as a usage error (``error: ...``, exit 2)."""

from __future__ import annotations


class DataError(ValueError):
    """The data (a path, file, record or value) cannot be used as asked."""


class CorruptFileError(DataError):
    """A file is truncated or fails its checksum; ``path`` names it."""

    def __init__(self, path: str, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason
