"""The manifest the converters write beside their shards, and file checksums.

``manifest.json`` records, per split, each shard's file name (relative to the manifest), number
of examples, size, SHA-256 and label range, plus the classes (classification) or sample shapes
(segmentation), and for images the training split's pixel statistics (``pixel_stats``) and
sizes (``image_sizes``). Readers use it to count examples without reading, to check labels
against ``--num_classes`` before training, to verify staged copies, and to default
``--num_classes``, ``--image_size`` and ``--input_channels``.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Sequence
from typing import Any

from input_pipelines.core.errors import DataError
from input_pipelines.core.files import data_root

MANIFEST = "manifest.json"
CHUNK = 4 * 2**20


def sha256_file(path: str) -> str:
    """Hex SHA-256 of the file at ``path``."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            digest.update(block)
    return digest.hexdigest()


def read_json(path: str) -> Any:
    """The JSON document at ``path``.

    Raises:
        DataError: naming the file when it is not valid JSON.
    """
    try:
        with open(path) as f:
            return json.load(f)
    except json.JSONDecodeError as err:
        raise DataError(f"{path} is not valid JSON: {err}") from None


def find_manifest(files: Sequence[str]) -> tuple[str, dict[str, Any]] | None:
    """The directory and contents of the manifest describing ``files``: ``manifest.json`` in
    the first file's folder or its parent (for ``SPLIT/`` sub-folders); ``None`` if absent."""
    if not files:
        return None
    folder = os.path.dirname(os.path.abspath(files[0]))
    for directory in (folder, os.path.dirname(folder)):
        path = os.path.join(directory, MANIFEST)
        if os.path.isfile(path):
            manifest = read_json(path)
            if not isinstance(manifest, dict) or "splits" not in manifest:
                raise DataError(f"{path} is not a tfscale manifest (it has no 'splits')")
            return directory, manifest
    return None


def beside(data_dir: str) -> tuple[str, dict[str, Any]] | None:
    """The path and contents of the manifest describing ``data_dir`` (a directory, a file or a
    glob): in its folder or the one above (for ``SPLIT/`` sub-folders); ``None`` if absent.

    Raises:
        DataError: naming the file when it is not valid JSON.
    """
    root = data_root(data_dir)
    for folder in (root, os.path.dirname(os.path.abspath(root))):
        path = os.path.join(folder, MANIFEST)
        if os.path.isfile(path):
            document = read_json(path)
            if isinstance(document, dict):
                return path, document
    return None


def file_entries(directory: str, manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every shard entry of ``manifest`` keyed by its absolute path."""
    return {os.path.join(directory, entry["file"]): entry
            for split in manifest["splits"].values() for entry in split["shards"]}


def entries_for(files: Sequence[str]) -> dict[str, dict[str, Any]]:
    """The manifest entries of those of ``files`` the manifest lists (empty without one)."""
    found = find_manifest(files)
    if found is None:
        return {}
    entries = file_entries(*found)
    return {f: entries[os.path.abspath(f)] for f in files if os.path.abspath(f) in entries}
