"""What ``--data_dir`` says about a classification run: its classes, and the size and channels
of its images. They give ``--num_classes``, ``--image_size`` and ``--input_channels`` their
defaults, and a flag that contradicts them stops the run before anything is built.

A dataset says where its data records them by naming, on its registry entry,
``shape="module:function"``: a function ``data_dir -> DataShape | None`` (None: nothing
recorded there). The built-in ones:

- :func:`from_manifest` (``imagenet``, ``lmdb``): the converter's ``manifest.json``, its
  ``classes`` and its training images' ``image_sizes``;
- :func:`from_class_folders` (``image_folder``): the class folders, and the sizes in the
  ``stats.json`` of ``python -m input_pipelines.tools.stats`` or, without one, in the headers of
  up to :data:`SAMPLE` of the images.

:func:`shapes_from_data` applies them to a config (the entry points hand it to
:func:`tfscale.cli.flags.config_from_flags`). Each of the three flags not given becomes

- ``--num_classes``: the number of classes;
- ``--input_channels``: 1 when every image is grayscale, else 3;
- ``--image_size``: the images' mean shorter side, at most the flag's default (224): larger
  images are scaled down to it, as before, and smaller ones are not blown up;

and one line says what was chosen and from where. A run that resumes (or evaluates) a checkpoint
keeps what it was trained with instead (its saved configuration). A given flag must agree with
the data: ``--num_classes`` must be the number of classes, and ``--image_size`` must lie within
:data:`FAR` times the images' sides, unless ``--force_image_size``: 224 px on 32 px images
enlarges each 7x, which costs 49x the compute and adds no detail.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Collection, Sequence
from typing import Any

from input_pipelines.core.class_folders import IMAGE_SUFFIXES, class_names, split_folder
from input_pipelines.core.errors import DataError
from input_pipelines.core.image_sizes import KEY as SIZES_KEY
from input_pipelines.core.image_sizes import ImageSizes
from input_pipelines.core.manifest import beside, read_json
from input_pipelines.core.stats import STATS
from input_pipelines.registry import hook
from tfscale.cluster import rank_zero
from tfscale.config.options import Option
from tfscale.config.train_config import TrainConfig
from tfscale.training import resume as config_change

FAR = 4  # --image_size more than this factor from every image's sides contradicts the data
SAMPLE = 64  # image headers read from class folders without a stats.json
SHAPE_FLAGS = ("image_size", "num_classes", "input_channels")
# Pillow's modes by the channels tf.io.decode_image gives them ("P": palette, decoded to RGB).
CHANNELS_OF_MODE = {"1": 1, "L": 1, "I": 1, "I;16": 1, "F": 1, "LA": 2, "P": 3, "RGBA": 4,
                    "CMYK": 4}

FORCE_IMAGE_SIZE: Option[bool] = Option(
    "force_image_size", False,
    "Train at --image_size even when it is more than 4x larger or smaller than the sides of "
    "every training image (as the converter's manifest.json or the class folders record them); "
    "without it such a size stops the run.")
OPTIONS = (FORCE_IMAGE_SIZE,)


@dataclasses.dataclass(frozen=True)
class DataShape:
    """The classes and image sizes that a dataset's files record.

    Attributes:
        where: what they were read from, for messages (a manifest's path, say).
        classes: the class names, label order.
        sizes: the training images' sizes, or None when the data does not record them.
        sizes_where: what the sizes were read from, when not ``where``.
    """

    where: str
    classes: tuple[str, ...]
    sizes: ImageSizes | None
    sizes_where: str = ""


def from_manifest(data_dir: str) -> DataShape | None:
    """The classes and image sizes in the converter's manifest of ``data_dir``, or None
    without a manifest that lists classes.

    Raises:
        DataError: a manifest that is not valid JSON.
    """
    found = beside(data_dir)
    if found is None or not found[1].get("classes"):
        return None
    path, manifest = found
    sizes = manifest.get(SIZES_KEY)
    return DataShape(path, tuple(str(c) for c in manifest["classes"]),
                     ImageSizes.from_dict(sizes) if sizes else None)


def from_class_folders(data_dir: str) -> DataShape | None:
    """The class folders of ``data_dir`` and the sizes of their images (see the module
    docstring), or None when it is not a folder of class folders."""
    try:
        folder = split_folder(data_dir, "train")
        names = class_names(folder)
    except DataError:
        return None
    stats_path = os.path.join(data_dir, STATS)
    stats = read_json(stats_path) if os.path.isfile(stats_path) else None
    if isinstance(stats, dict) and stats.get(SIZES_KEY):
        return DataShape(f"the class folders in {folder}", tuple(names),
                         ImageSizes.from_dict(stats[SIZES_KEY]), stats_path)
    sizes = header_sizes(sampled_images(folder, names))
    return DataShape(f"the class folders in {folder}", tuple(names),
                     sizes if sizes.images else None,
                     f"the headers of {sizes.images} of its images")


def sampled_images(folder: str, names: Sequence[str], count: int = SAMPLE) -> list[str]:
    """Up to ``count`` image files of the class folders ``names`` under ``folder``: the first
    (by name) of each class in turn, so that every class is seen when there are few."""
    per_class = max(1, math.ceil(count / len(names)))
    found: list[str] = []
    for name in names:
        class_dir = os.path.join(folder, name)
        images = sorted(e.name for e in os.scandir(class_dir)
                        if e.is_file() and e.name.lower().endswith(IMAGE_SUFFIXES)
                        and not e.name.startswith("."))
        found += [os.path.join(class_dir, image) for image in images[:per_class]]
        if len(found) >= count:
            break
    return found[:count]


def header_sizes(paths: Sequence[str]) -> ImageSizes:
    """The sizes of the images at ``paths`` from their headers (files that do not open are
    left to the pipeline's checks)."""
    from PIL import Image, UnidentifiedImageError

    sizes = ImageSizes()
    for path in paths:
        try:
            with Image.open(path) as image:
                width, height = image.size
                channels = CHANNELS_OF_MODE.get(image.mode, 3)
        except (OSError, UnidentifiedImageError):
            continue
        sizes.add((height, width, channels))
    return sizes


def _default(name: str) -> Any:
    return next(f.default for f in dataclasses.fields(TrainConfig) if f.name == name)


def _class_list(classes: Sequence[str]) -> str:
    shown = list(classes) if len(classes) <= 6 else [*classes[:3], "...", classes[-1]]
    return ", ".join(shown)


def image_size_for(sizes: ImageSizes) -> tuple[int, str]:
    """The ``--image_size`` for images of ``sizes`` and why, in words."""
    size = min(_default("image_size"), round(sizes.shorter_side_mean))
    if size < round(sizes.shorter_side_mean):
        return size, f"the default: its training images are {sizes.describe()}"
    return size, f"its training images are {sizes.describe()}"


def far_from(image_size: int, sizes: ImageSizes) -> str:
    """How ``image_size`` is more than :data:`FAR` times away from every image's sides, in
    words; "" when it is not."""
    where = sizes.describe()
    if image_size > FAR * sizes.largest_side:
        return (f"{image_size / sizes.largest_side:.1f}x the longest side of any training image "
                f"({where}): each would be enlarged that much, which costs compute and adds no "
                "detail")
    if FAR * image_size < sizes.smallest_side:
        return (f"1/{sizes.smallest_side / image_size:.1f} of the shortest side of any training "
                f"image ({where}): each would be shrunk that much, losing its detail")
    return ""


def check_given(config: TrainConfig, given: Collection[str], shape: DataShape,
                saved: dict[str, Any]) -> None:
    """Checks the given ``--num_classes`` and ``--image_size`` against ``shape``; a value that
    the resumed run was trained with (``saved``) passes.

    Raises:
        ValueError: one line naming the flag, its value, what the data holds and the ways out.
    """
    def checked(name: str) -> bool:
        return name in given and saved.get(name) != getattr(config, name)

    classes = len(shape.classes)
    if checked("num_classes") and config.num_classes != classes:
        beyond = (f"label {classes - 1}" if config.num_classes == classes - 1
                  else f"labels {config.num_classes} to {classes - 1}")
        what = (f"{config.num_classes - classes} of its outputs would never be a label"
                if config.num_classes > classes else f"{beyond} would be out of range")
        raise ValueError(f"--num_classes={config.num_classes} contradicts the data, which has "
                         f"{classes} classes ({_class_list(shape.classes)}) according to "
                         f"{shape.where}: {what}; drop --num_classes to train {classes}")
    if shape.sizes is None or not checked("image_size") or FORCE_IMAGE_SIZE.of(config):
        return
    far = far_from(config.image_size, shape.sizes)
    if far:
        size, _ = image_size_for(shape.sizes)
        raise ValueError(f"--image_size={config.image_size} is {far} (per "
                         f"{shape.sizes_where or shape.where}); drop --image_size to train at "
                         f"{size} px, or add --{FORCE_IMAGE_SIZE.name} to train at "
                         f"{config.image_size} px anyway")


def shapes_from_data(config: TrainConfig, given: Collection[str],
                     log: Callable[[str], object] = rank_zero.log) -> TrainConfig:
    """``config`` with ``--image_size``, ``--num_classes`` and ``--input_channels`` taken from
    what ``--data_dir`` records where they are not ``given`` (see the module docstring); says
    in one line on ``log`` what it chose and why.

    Args:
        config: the config the flags give.
        given: the names of the flags given on the command line.
        log: prints the line (the chief's).

    Raises:
        ValueError: a given flag contradicts the data (see :func:`check_given`).
        DataError: a manifest or stats.json that is not valid JSON.
    """
    reader = hook(config.dataset, "shape") if config.data_dir else None
    shape: DataShape | None = reader(config.data_dir) if reader is not None else None
    if shape is None:
        return config
    saved = config_change.resumed_config(config) or {}
    check_given(config, given, shape, saved)
    sizes = shape.sizes
    from_data: dict[str, tuple[Any, str]] = {
        "num_classes": (len(shape.classes), f"its classes {_class_list(shape.classes)}")}
    if sizes is not None:
        from_data["image_size"] = image_size_for(sizes)
        from_data["input_channels"] = ((1, "grayscale images") if sizes.grayscale
                                       else (3, "colour images"))
    chosen: dict[str, Any] = {}
    said = []
    for name in SHAPE_FLAGS:
        if name in given or (name not in saved and name not in from_data):
            continue
        if name in saved:
            chosen[name] = saved[name]
            why = f"as {config.model_dir} was trained"
            if name in from_data and from_data[name][0] != saved[name]:
                why += f"; the data gives {from_data[name][0]}"
        else:
            chosen[name], why = from_data[name]
        said.append(f"--{name}={chosen[name]} ({why})")
    if not said:
        return config
    where = shape.where + (f" and {shape.sizes_where}" if shape.sizes_where else "")
    missing = "" if sizes is not None or {"image_size", "input_channels"} <= {*given, *saved} \
        else (f"; it records no image sizes, so --image_size={config.image_size} and "
              f"--input_channels={config.input_channels} stay (rerun the converter to record "
              "them, or give the flags)")
    log(f"from {where}: {', '.join(said)}{missing}")
    return config.replace(**chosen)
