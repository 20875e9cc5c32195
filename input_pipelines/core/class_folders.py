"""Image folders: one sub-folder per class, optionally under ``train/`` and ``validation/``.

    DATA_DIR/cat/1.jpg, DATA_DIR/dog/2.png ...               (training split only)
    DATA_DIR/train/cat/1.jpg ..., DATA_DIR/validation/cat/9.jpg ...

Classes are the sorted sub-folder names of the training folder; label ``i`` is the ``i``-th
class in both splits. Used by the ``image_folder`` dataset and the TFRecord converter.
"""

from __future__ import annotations

import dataclasses
import os

from input_pipelines.core.errors import CorruptFileError, DataError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".gif", ".bmp")
# Leading bytes of the formats tf.io.decode_image reads.
SIGNATURES = (b"\xff\xd8\xff", b"\x89PNG\r\n\x1a\n", b"GIF87a", b"GIF89a", b"BM")


@dataclasses.dataclass(frozen=True)
class ImageFolder:
    """The images of one split and their labels."""

    root: str
    classes: list[str]
    paths: list[str]
    labels: list[int]
    ignored: list[str]  # files in class folders that are not images


def split_folder(data_dir: str, split: str, flag: str = "--data_dir") -> str:
    """The folder holding ``split``'s class folders.

    Raises:
        DataError: ``data_dir`` does not exist, or the split has no folder.
    """
    if not data_dir:
        raise DataError(f"{flag} is empty; give the folder of class sub-folders")
    if not os.path.isdir(data_dir):
        raise DataError(f"{flag}={data_dir} does not exist or is not a folder")
    named = os.path.join(data_dir, split)
    if os.path.isdir(named):
        return named
    if split == "train" and not os.path.isdir(os.path.join(data_dir, "validation")):
        return data_dir
    raise DataError(f"{flag}={data_dir} has no {split}/ folder of class sub-folders")


def has_validation(data_dir: str) -> bool:
    """True when ``data_dir`` has a ``validation/`` folder (``image_folder``'s
    ``has_validation=`` rule, see :mod:`input_pipelines.registry`)."""
    return os.path.isdir(os.path.join(data_dir, "validation"))


def class_names(folder: str) -> list[str]:
    """Sorted sub-folder names of ``folder``.

    Raises:
        DataError: there are none.
    """
    names = sorted(e.name for e in os.scandir(folder) if e.is_dir() and not e.name.startswith("."))
    if not names:
        raise DataError(f"{folder} has no class sub-folders (expected {folder}/CLASS/IMAGE)")
    return names


def list_images(data_dir: str, split: str, flag: str = "--data_dir") -> ImageFolder:
    """The images of ``split`` under ``data_dir``, sorted by class then path.

    Raises:
        DataError: a missing folder, a validation class unknown to training, or no images.
    """
    classes = class_names(split_folder(data_dir, "train", flag))
    folder = split_folder(data_dir, split, flag)
    unknown = sorted(set(class_names(folder)) - set(classes))
    if unknown:
        raise DataError(f"{folder} has class folders that training lacks: {', '.join(unknown)}")
    paths: list[str] = []
    labels: list[int] = []
    ignored: list[str] = []
    for label, name in enumerate(classes):
        class_dir = os.path.join(folder, name)
        if not os.path.isdir(class_dir):
            continue
        for dirpath, dirnames, filenames in os.walk(class_dir):
            dirnames.sort()
            for filename in sorted(filenames):
                if filename.startswith("."):
                    continue
                path = os.path.join(dirpath, filename)
                if filename.lower().endswith(IMAGE_SUFFIXES):
                    paths.append(path)
                    labels.append(label)
                else:
                    ignored.append(path)
    if not paths:
        raise DataError(f"{folder} has no images ({', '.join(IMAGE_SUFFIXES)}) in its class "
                        "folders")
    return ImageFolder(folder, classes, paths, labels, ignored)


def image_files(data_dir: str, split: str) -> list[str]:
    """The image files of ``split`` (``image_folder``'s ``files=`` rule, see
    :mod:`input_pipelines.registry`).

    Raises:
        DataError: as :func:`list_images`.
    """
    return list_images(data_dir, split).paths


def check_signature(path: str) -> None:
    """Checks that ``path`` starts like a JPEG, PNG, GIF or BMP file.

    Raises:
        CorruptFileError: it does not (empty, truncated to nothing, or another format).
    """
    with open(path, "rb") as f:
        head = f.read(8)
    if not head.startswith(SIGNATURES):
        what = "is empty" if not head else "is not a JPEG, PNG, GIF or BMP image"
        raise CorruptFileError(path, f"cannot decode the image: the file {what}")
