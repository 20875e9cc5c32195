"""Convert image folders (one sub-folder per class) to LMDB environments of Caffe ``Datum`` records.

    python -m input_pipelines.tools.folder_to_lmdb --input_dir /data/pets \\
        --output_dir /data/pets-lmdb [--encoding keep|jpeg|raw] [--validation_fraction 0.1]

Reads the folders as ``folder_to_tfrecord`` does (``INPUT_DIR/CLASS/*`` or
``INPUT_DIR/{train,validation}/CLASS/*``, or ``--validation_fraction`` held out of each class),
shuffles each split with ``--seed`` and writes ``OUTPUT_DIR/train/`` and
``OUTPUT_DIR/validation/`` (LMDB environments: ``data.mdb``) the way Caffe's
``convert_imageset`` writes them, for ``--dataset=lmdb`` and for Caffe-era tools alike: the
``i``-th image's key is ``"%08d_%s" % (i, its path under the split's folder)``, its value a
serialized ``Datum`` (:mod:`input_pipelines.core.datum`) with its label. ``--encoding=keep``
(default) stores each file's bytes (``convert_imageset --encoded``), ``jpeg`` keeps JPEG files
and re-encodes the rest as JPEG, ``raw`` stores ``uint8`` pixels channels first in BGR order
(``convert_imageset``'s default; grayscale stays one channel, alpha is dropped). Every image is
decoded on the way; one that does not decode stops the conversion naming it.

``manifest.json`` lists each split's ``data.mdb`` (examples, bytes, SHA-256, label range, a
fingerprint of the inputs), the classes, and the training images' pixel statistics
(``pixel_stats``, for ``--normalization=dataset``) and sizes (``image_sizes``, for the default
``--image_size`` and ``--input_channels``). An environment is written under a temporary
name and renamed when complete; re-running skips a split whose environment still matches its
manifest entry and inputs. Images are decoded and encoded on ``--workers`` processes (default:
every core) and written in order, with a progress line of images, images/s and the time left;
the environments are the same bytes for any number of workers.
"""

from __future__ import annotations

import functools
import os
import shutil
import sys
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from input_pipelines.core import datum
from input_pipelines.core.encode_pool import Encode, EncodePool
from input_pipelines.core.image_sizes import KEY as SIZES_KEY
from input_pipelines.core.lmdb_env import DATA_FILE, import_lmdb
from input_pipelines.core.manifest import MANIFEST, sha256_file
from input_pipelines.core.preprocessing_choice import STATS_KEY
from input_pipelines.core.report import Progress
from input_pipelines.core.shard_writer import (
    fingerprint,
    load_manifest,
    run_converter,
    still_valid,
)
from input_pipelines.core.stats import ImageStats
from input_pipelines.tools.folder_to_tfrecord import (
    TRAINING_MARKER,
    check_encoding,
    image_parser,
    image_splits,
    shuffled_items,
    stored_image,
)
from tfscale.config.tasks import CLASSIFICATION
from tfscale.training.files import write_json_atomic

ENCODINGS = ("keep", "jpeg", "raw")
COMMIT = 1000  # records per write transaction, as convert_imageset commits
MAP_SIZE = 2**30  # initial map size; doubled whenever a transaction fills it


def datum_record(item: tuple[str, int], stats: ImageStats | None, encoding: str,
                 quality: int) -> tuple[bytes, int, int]:
    """An :data:`~input_pipelines.core.encode_pool.Encode` of (path, label) items: the
    serialized ``Datum`` of the image at ``path`` and its label twice; its stored pixels are
    added to ``stats``.

    Raises:
        DataError: the image does not decode (naming ``path``).
    """
    path, label = item
    if encoding != "raw":
        encoded, _, _ = stored_image(path, encoding, quality, stats)
        return datum.encode(datum.Datum(data=encoded, label=label, encoded=True)), label, label
    encoded, _, image = stored_image(path, "keep", quality, stats)
    if image.shape[-1] in (2, 4):  # drop alpha, as cv::imread does
        image = image[..., :-1]
    if image.shape[-1] == 3:
        image = image[..., ::-1]  # RGB -> BGR, OpenCV's order
    chw = np.ascontiguousarray(np.transpose(image, (2, 0, 1)))
    record = datum.encode(datum.Datum(data=chw.tobytes(), label=label, channels=chw.shape[0],
                                      height=chw.shape[1], width=chw.shape[2]))
    return record, label, label


def _commit(environment: Any, batch: list[tuple[bytes, bytes]]) -> None:
    """Writes ``batch`` in one transaction, growing the map until it fits."""
    lmdb = import_lmdb()
    while True:
        try:
            with environment.begin(write=True) as txn:
                for key, value in batch:
                    txn.put(key, value, append=True)
            return
        except lmdb.MapFullError:
            environment.set_mapsize(environment.info()["map_size"] * 2)


def write_environment(directory: str, records: Iterable[tuple[bytes, bytes]]) -> None:
    """Writes ``records`` (key, value; keys ascending) as the LMDB environment ``directory``,
    through a temporary folder renamed into place once complete."""
    lmdb = import_lmdb()
    tmp = f"{directory}.tmp.{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        environment = lmdb.open(tmp, map_size=MAP_SIZE, subdir=True, lock=False)
        batch: list[tuple[bytes, bytes]] = []
        for record in records:
            batch.append(record)
            if len(batch) == COMMIT:
                _commit(environment, batch)
                batch = []
        if batch:
            _commit(environment, batch)
        environment.close()
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    shutil.rmtree(directory, ignore_errors=True)
    os.replace(tmp, directory)


def _records(pool: EncodePool, encode: Encode[tuple[str, int]], items: list[tuple[str, int]],
             root: str, stats: ImageStats | None,
             progress: Progress) -> Iterator[tuple[bytes, bytes]]:
    """(key, Datum) of each of ``items`` in order, encoded on ``pool`` a transaction at a time;
    the images' statistics are merged into ``stats`` in order."""
    for start in range(0, len(items), COMMIT):
        window = items[start:start + COMMIT]
        encoded = pool.map(encode, ImageStats if stats is not None else None, window)
        for index, ((path, _), (record, _, _, piece)) in enumerate(
                zip(window, encoded, strict=True), start):
            if stats is not None and piece is not None:
                stats.merge(piece)
            progress.advance(items=1)
            yield datum.caffe_key(index, os.path.relpath(path, root)), record


def _entry(output_dir: str, name: str, items: list[tuple[str, int]], inputs: str,
           stats: ImageStats | None) -> dict[str, Any]:
    """The manifest entry of the environment file ``name`` just written from ``items``."""
    path = os.path.join(output_dir, name)
    labels = [label for _, label in items]
    entry = {"file": name, "examples": len(items), "bytes": os.path.getsize(path),
             "sha256": sha256_file(path), "inputs": inputs, "label_min": min(labels),
             "label_max": max(labels)}
    if stats is not None:
        entry["stats"] = stats.to_dict()
    return entry


def convert(input_dir: str, output_dir: str, encoding: str = "keep", quality: int = 95,
            seed: int = 0, validation_fraction: float = 0.0,
            workers: int = 1) -> dict[str, list[str]]:
    """Converts ``input_dir`` into LMDB environments under ``output_dir``, encoding on
    ``workers`` processes.

    Returns:
        The environments skipped as already written, per split.

    Raises:
        DataError: a bad folder or image, or a bad argument.
    """
    check_encoding(encoding, ENCODINGS)
    folders = image_splits(input_dir, validation_fraction, seed)
    os.makedirs(output_dir, exist_ok=True)
    header: dict[str, Any] = {"task": CLASSIFICATION, "classes": folders["train"].classes,
                              "encoding": encoding, "keys": "%08d_%s (Caffe convert_imageset)"}
    manifest = load_manifest(output_dir, header, fmt="lmdb")
    progress = Progress(f"writing {output_dir}", sum(len(f.paths) for f in folders.values()),
                        0, unit="images")
    skipped: dict[str, list[str]] = {}
    encode = functools.partial(datum_record, encoding=encoding, quality=quality)
    with EncodePool(workers) as pool:
        for split, folder in folders.items():
            marker = TRAINING_MARKER if split == "train" else ""
            items, identities = shuffled_items(folder, input_dir, seed,
                                               f"{encoding}|{quality}{marker}")
            name = f"{split}/{DATA_FILE}"
            inputs = fingerprint(identities)
            entry = manifest["splits"].get(split, {}).get("shards", [None])[0]
            skipped[split] = [name] if still_valid(output_dir, entry, inputs) else []
            if skipped[split]:
                progress.advance(items=len(items))
            else:
                stats = ImageStats() if split == "train" else None
                write_environment(os.path.join(output_dir, split),
                                  _records(pool, encode, items, folder.root, stats, progress))
                entry = _entry(output_dir, name, items, inputs, stats)
            manifest["splits"][split] = {"examples": entry["examples"], "shards": [entry]}
            write_json_atomic(os.path.join(output_dir, MANIFEST), manifest)
    progress.done()
    training = ImageStats()
    training.merge(manifest["splits"]["train"]["shards"][0]["stats"])
    manifest[STATS_KEY] = training.summary()
    manifest[SIZES_KEY] = training.sizes.to_dict()
    write_json_atomic(os.path.join(output_dir, MANIFEST), manifest)
    return skipped


def main(argv: Sequence[str] | None = None) -> int:
    args = image_parser("input_pipelines.tools.folder_to_lmdb", __doc__.split("\n")[0],
                        ENCODINGS, "keep: the file's bytes; jpeg: JPEG (re-encode other formats); "
                        "raw: uint8 BGR pixels, channels first (Caffe's default).",
                        shards=False).parse_args(argv)
    options = (args.encoding, args.quality, args.seed, args.validation_fraction, args.workers)
    return run_converter(args.output_dir,
                         lambda: convert(args.input_dir, args.output_dir, *options))


if __name__ == "__main__":
    sys.exit(main())
