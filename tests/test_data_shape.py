"""--image_size, --num_classes and --input_channels from what --data_dir records, and flags
that contradict it (input_pipelines/core/data_shape.py, image_sizes.py, the flags' hook)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from absl import flags
from PIL import Image

from input_pipelines import shapes_from_data
from input_pipelines.core.image_sizes import ImageSizes
from tfscale.cli import plugins
from tfscale.cli.flags import config_from_flags, define_flags
from tfscale.config.train_config import TrainConfig
from tfscale.training.resume import check_resume, save

SHAPES = ("circle", "cross", "square", "triangle")


def sizes(*shapes: tuple[int, int, int]) -> dict[str, Any]:
    recorded = ImageSizes()
    for shape in shapes:
        recorded.add(shape)
    return recorded.to_dict()


def converted(root: Path, image_sizes: dict[str, Any] | None = None,
              classes: tuple[str, ...] = SHAPES) -> Path:
    """A converter's output as the trainer sees it before reading a record: a shard and the
    manifest (with ``image_sizes`` unless None: a converter from before they were recorded)."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "train-00000-of-00001.tfrecord").write_bytes(b"")
    manifest: dict[str, Any] = {"task": "classification", "format": "tfrecord",
                                "classes": list(classes), "splits": {}}
    if image_sizes is not None:
        manifest["image_sizes"] = image_sizes
    (root / "manifest.json").write_text(json.dumps(manifest))
    return root


def config(*argv: str, log: list[str] | None = None) -> TrainConfig:
    """The config ``python -m tfscale.train ARGV`` trains with (its entry point's hooks)."""
    values = flags.FlagValues()
    define_flags(values)
    values(["prog", "--model=tiny_cnn", *argv])
    said = log if log is not None else []
    return config_from_flags(values, plugins.choose_dataset,
                             lambda c, given: shapes_from_data(c, given, said.append))


def test_a_converted_dataset_gives_its_size_classes_and_channels(tmp_path: Path) -> None:
    data = converted(tmp_path / "shapes_tfr", sizes(*[(32, 32, 3)] * 5))
    log: list[str] = []
    cfg = config(f"--data_dir={data}", f"--model_dir={tmp_path / 'run'}", log=log)
    assert (cfg.dataset, cfg.image_size, cfg.num_classes, cfg.input_channels) == (
        "imagenet", 32, 4, 3)
    assert log == [f"from {data}/manifest.json: --image_size=32 (its training images are 32x32), "
                   "--num_classes=4 (its classes circle, cross, square, triangle), "
                   "--input_channels=3 (colour images)"]
    # The launcher hands its workers every value as a flag: they agree with the data, silently.
    again: list[str] = []
    assert config(*cfg.to_argv(), log=again) == cfg and again == []


def test_grayscale_varied_and_large_images(tmp_path: Path) -> None:
    gray = converted(tmp_path / "digits", sizes((20, 24, 1), (28, 40, 1), (30, 30, 2)))
    log: list[str] = []
    cfg = config(f"--data_dir={gray}", "--num_classes=4", log=log)
    assert (cfg.image_size, cfg.input_channels) == (26, 1)  # mean shorter side (20+28+30)/3
    assert log == [f"from {gray}/manifest.json: --image_size=26 (its training images are 20-30 "
                   "px high, 24-40 px wide, mean shorter side 26 px), --input_channels=1 "
                   "(grayscale images)"]
    photos = converted(tmp_path / "photos", sizes((375, 500, 3), (480, 640, 3), (333, 500, 1)))
    log.clear()
    cfg = config(f"--data_dir={photos}", "--input_channels=3", log=log)
    assert (cfg.image_size, cfg.num_classes) == (224, 4)
    assert "--image_size=224 (the default: its training images are 333-480 px high" in log[0]


def test_a_manifest_without_sizes_gives_the_classes_and_says_what_stays(tmp_path: Path) -> None:
    data = converted(tmp_path / "old", None, classes=("a", "b", "c", "d", "e", "f", "g"))
    log: list[str] = []
    cfg = config(f"--data_dir={data}", log=log)
    assert (cfg.image_size, cfg.num_classes, cfg.input_channels) == (224, 7, 3)
    assert log == [f"from {data}/manifest.json: --num_classes=7 (its classes a, b, c, ..., g); "
                   "it records no image sizes, so --image_size=224 and --input_channels=3 stay "
                   "(rerun the converter to record them, or give the flags)"]


@pytest.mark.parametrize("flag, message", [
    ("--num_classes=10", r"--num_classes=10 contradicts the data, which has 4 classes \(circle, "
                         r"cross, square, triangle\) according to .*manifest.json: 6 of its "
                         r"outputs would never be a label; drop --num_classes to train 4"),
    ("--num_classes=3", r"--num_classes=3 contradicts the data, .*: label 3 would be out of "
                        r"range"),
    ("--image_size=224", r"--image_size=224 is 7.0x the longest side of any training image "
                         r"\(32x32\): each would be enlarged that much, which costs compute and "
                         r"adds no detail \(per .*manifest.json\); drop --image_size to train at "
                         r"32 px, or add --force_image_size to train at 224 px anyway"),
    ("--image_size=4", r"--image_size=4 is 1/8.0 of the shortest side of any training image"),
])
def test_a_flag_that_contradicts_the_data_stops(tmp_path: Path, flag: str, message: str) -> None:
    data = converted(tmp_path / "shapes_tfr", sizes((32, 32, 3)))
    with pytest.raises(ValueError, match=message):
        config(f"--data_dir={data}", flag)


def test_sizes_within_reach_or_forced_pass(tmp_path: Path) -> None:
    data = converted(tmp_path / "shapes_tfr", sizes((32, 32, 3)))
    assert config(f"--data_dir={data}", "--image_size=128").image_size == 128  # 4x: allowed
    forced = config(f"--data_dir={data}", "--image_size=224", "--force_image_size")
    assert (forced.image_size, forced.num_classes) == (224, 4)
    with pytest.raises(ValueError, match="--force_image_size only applies to --dataset="):
        config("--dataset=synthetic", "--force_image_size")


def test_resuming_keeps_what_the_run_was_trained_with(tmp_path: Path) -> None:
    data = converted(tmp_path / "shapes_tfr", sizes((32, 32, 3)))
    run = tmp_path / "run"

    def trained(cfg: TrainConfig) -> None:
        run.mkdir(exist_ok=True)
        save(cfg)
        (run / "checkpoints").mkdir(exist_ok=True)
        (run / "checkpoints" / "ckpt-000000003.npz").write_bytes(b"")

    # The same command again resumes: the data gives the same values, nothing differs.
    first = config(f"--data_dir={data}", f"--model_dir={run}", "--epochs=3")
    trained(first)
    log: list[str] = []
    resumed = config(f"--data_dir={data}", f"--model_dir={run}", "--epochs=3", log=log)
    assert resumed == first
    check_resume(resumed, print)
    assert log[0].startswith(f"from {data}/manifest.json: --image_size=32 (as {run} was trained)")
    # A run from before the data gave defaults (224 px, 1000 classes) resumes as it was trained,
    # and its workers, given those values as flags, are not stopped by them.
    old = TrainConfig(model="tiny_cnn", dataset="imagenet", data_dir=str(data), steps=0,
                      model_dir=str(run))
    trained(old)
    log.clear()
    resumed = config(f"--data_dir={data}", f"--model_dir={run}", log=log)
    assert (resumed.image_size, resumed.num_classes) == (224, 1000)
    check_resume(resumed, print)
    assert log == [f"from {data}/manifest.json: --image_size=224 (as {run} was trained; the data "
                   f"gives 32), --num_classes=1000 (as {run} was trained; the data gives 4), "
                   f"--input_channels=3 (as {run} was trained)"]
    assert config(*resumed.to_argv()) == resumed
    # A new run into another model_dir takes the data's.
    assert config(f"--data_dir={data}", f"--model_dir={tmp_path / 'new'}").num_classes == 4


def png(path: Path, height: int, width: int, mode: str = "RGB") -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new(mode, (width, height)).save(path)


def test_class_folders_give_their_classes_and_sampled_sizes(tmp_path: Path) -> None:
    for name in SHAPES[:3]:
        for i in range(3):
            png(tmp_path / "shapes" / name / f"{i}.png", 16, 16, "L")
    (tmp_path / "shapes" / "circle" / "notes.txt").write_text("not an image")
    log: list[str] = []
    cfg = config(f"--data_dir={tmp_path / 'shapes'}", log=log)
    assert (cfg.dataset, cfg.image_size, cfg.num_classes, cfg.input_channels) == (
        "image_folder", 16, 3, 1)
    assert log == [f"from the class folders in {tmp_path / 'shapes'} and the headers of 9 of its "
                   "images: --image_size=16 (its training images are 16x16), --num_classes=3 "
                   "(its classes circle, cross, square), --input_channels=1 (grayscale images)"]
    # The statistics tool's stats.json records every image's size: it is taken instead.
    (tmp_path / "shapes" / "stats.json").write_text(json.dumps(
        {"image_sizes": sizes((24, 24, 3), (28, 28, 3))}))
    log.clear()
    cfg = config(f"--data_dir={tmp_path / 'shapes'}", log=log)
    assert (cfg.image_size, cfg.input_channels) == (26, 3)
    assert f"and {tmp_path / 'shapes' / 'stats.json'}: " in log[0]


def test_image_sizes_merge_in_any_grouping() -> None:
    one, two, whole = ImageSizes(), ImageSizes(), ImageSizes()
    for shape in ((10, 20, 3), (40, 8, 1)):
        one.add(shape)
        whole.add(shape)
    two.add((30, 30, 4))
    whole.add((30, 30, 4))
    merged = ImageSizes.from_dict(one.to_dict())
    merged.merge(two.to_dict())
    assert merged.to_dict() == whole.to_dict() == {
        "images": 3, "height": [10, 40], "width": [8, 30], "shorter_side_sum": 48,
        "channels": {"1": 1, "3": 1, "4": 1}}
    assert (whole.smallest_side, whole.largest_side, whole.grayscale) == (8, 40, False)
