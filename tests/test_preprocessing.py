"""Classification preprocessing: augment modes, flips, evaluation crop, normalization, preview."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import tensorflow as tf

from input_pipelines import PIPELINES
from input_pipelines.core import image_preprocessing
from input_pipelines.core.preprocessing_choice import (
    MEAN_RGB,
    STDDEV_RGB,
    PixelStats,
    Preprocessing,
    resolve_preprocessing,
)
from input_pipelines.tools import folder_to_tfrecord, preview, stats
from tests.pipeline_data import ONE, config


def resolved(image_size: int = 16, stats_: PixelStats | None = None,
             **overrides: object) -> Preprocessing:
    return resolve_preprocessing(config("unused", "imagenet", image_size=image_size,
                                        **overrides), stats_)


def train(pixels: np.ndarray, seed: int, preprocessing: Preprocessing,
          size: int = 16) -> np.ndarray:
    encoded = tf.io.encode_png(pixels)
    return image_preprocessing.train_image(encoded, tf.constant([7, seed], tf.int64), size,
                                           pixels.shape[-1], preprocessing).numpy()


def pixels_of(images: np.ndarray, preprocessing: Preprocessing) -> np.ndarray:
    """Normalized images back to pixel values (0-255)."""
    return images * np.asarray(preprocessing.std) + np.asarray(preprocessing.mean)


def random_image(seed: int, height: int = 16, width: int = 16) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), np.uint8)


def write_folder(root: Path, images: dict[str, np.ndarray]) -> None:
    """Writes ``root/RELATIVE_PATH.png`` for each entry."""
    for name, pixels in images.items():
        path = root / f"{name}.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(tf.io.encode_png(pixels).numpy())


@pytest.mark.parametrize(("size", "augment", "flip", "crop"), [
    (16, "none", False, 1.0), (32, "none", False, 1.0), (127, "none", False, 1.0),
    (128, "imagenet", True, 0.875), (224, "imagenet", True, 0.875)])
def test_auto_resolves_by_image_size(size, augment, flip, crop):
    got = resolved(size)
    assert (got.augment, got.flip, got.eval_crop_fraction) == (augment, flip, crop)
    assert got.normalization == "imagenet"  # no statistics given
    np.testing.assert_allclose(got.mean, 255 * np.array(MEAN_RGB))


def test_explicit_choices_override_auto():
    assert resolved(32, augment="small").flip  # asked for: the CIFAR recipe flips
    flips = resolved(32, horizontal_flip="on")
    assert (flips.augment, flips.flip) == ("flip", True)
    assert not resolved(224, horizontal_flip="off").flip
    assert not resolved(224, augment="none").flip
    assert resolved(32, augment="flip").flip
    assert resolved(224, eval_crop_fraction=0.5).eval_crop_fraction == 0.5
    assert resolved(16, input_channels=1).mean == pytest.approx((255 * 0.449,))
    assert resolved(normalization="none").std == (255.0, 255.0, 255.0)
    with pytest.raises(ValueError, match="--augment=none .*--horizontal_flip=on"):
        resolved(augment="none", horizontal_flip="on")


def test_dataset_statistics_are_used_when_present_and_required_when_asked():
    found = PixelStats("/d/manifest.json", (10.0, 20.0, 30.0), (2.0, 3.0, 4.0))
    got = resolved(16, found)
    assert (got.normalization, got.mean, got.std) == ("dataset", found.mean, found.std)
    assert resolved(16, found, normalization="imagenet").normalization == "imagenet"
    with pytest.raises(ValueError, match=r"--normalization=dataset.*manifest\.json or "
                                         r"stats\.json.*input_pipelines\.tools\.stats"):
        resolved(16, None, normalization="dataset")


@pytest.mark.parametrize("augment", ["imagenet", "small", "flip", "none"])
def test_each_mode_gives_the_shape_and_range_and_is_a_function_of_the_seed(augment):
    pixels = random_image(1, 20, 24)
    preprocessing = resolved(16, augment=augment)
    outs = [train(pixels, seed, preprocessing) for seed in range(8)]
    for out in outs:
        assert out.shape == (16, 16, 3) and out.dtype == np.float32
        back = pixels_of(out, preprocessing)
        assert back.min() >= -1e-3 and back.max() <= 255 + 1e-3
    np.testing.assert_array_equal(outs[3], train(pixels, 3, preprocessing))
    distinct = len({o.tobytes() for o in outs})
    assert distinct == 1 if augment == "none" else distinct > 1


def test_none_is_the_whole_image_resized_and_normalized():
    pixels = random_image(2, 20, 24)
    for normalization, mean, std in (("imagenet", 255 * np.array(MEAN_RGB),
                                      255 * np.array(STDDEV_RGB)), ("none", 0.0, 255.0)):
        preprocessing = resolved(16, augment="none", normalization=normalization)
        expected = (tf.image.resize(pixels, [16, 16]).numpy() - mean) / std
        for seed in range(4):
            np.testing.assert_allclose(train(pixels, seed, preprocessing), expected, atol=1e-5)


def test_small_crops_are_shifts_of_the_image_padded_by_an_eighth():
    pixels = random_image(3, 32, 32)
    preprocessing = resolved(32, augment="small", horizontal_flip="off")
    padded = np.pad(pixels.astype(np.float64), [(4, 4), (4, 4), (0, 0)])
    shifts = set()
    for seed in range(16):
        back = pixels_of(train(pixels, seed, preprocessing, 32), preprocessing)
        found = [(dy, dx) for dy in range(9) for dx in range(9)
                 if np.allclose(back, padded[dy:dy + 32, dx:dx + 32], atol=1e-3)]
        assert len(found) == 1, seed
        shifts |= set(found)
    assert len(shifts) > 4


@pytest.mark.parametrize("augment", ["imagenet", "small", "flip"])
def test_flips_happen_for_some_seeds_and_never_when_off(augment):
    pixels = np.zeros((16, 16, 3), np.uint8)
    pixels[:, :4] = 255  # a white stripe on the left only

    def left_brighter(preprocessing: Preprocessing) -> list[bool]:
        outs = [pixels_of(train(pixels, seed, preprocessing), preprocessing)
                for seed in range(24)]
        return [bool(o[:, :8].mean() > o[:, 8:].mean()) for o in outs]

    on = left_brighter(resolved(augment=augment, horizontal_flip="on"))
    assert any(on) and not all(on)
    off = left_brighter(resolved(augment=augment, horizontal_flip="off"))
    if augment == "imagenet":  # a crop can miss the stripe; a mirror would put it right
        assert sum(off) > sum(on)
    else:
        assert all(off)


def test_evaluation_crop_fraction_of_the_shorter_side():
    pixels = np.zeros((32, 32, 3), np.uint8)
    pixels[:16, 16:] = 85
    pixels[16:, :16] = 170
    pixels[16:, 16:] = 255  # four distinct grey quadrants (JPEG keeps grey edges sharp)
    for encode, atol in ((tf.io.encode_png, 1e-3), (tf.io.encode_jpeg, 24)):
        half = resolved(16, eval_crop_fraction=0.5)
        out = image_preprocessing.eval_image(encode(pixels), 16, 3, half).numpy()
        np.testing.assert_allclose(pixels_of(out, half), pixels[8:24, 8:24], atol=atol)
        whole = resolved(32)
        out = image_preprocessing.eval_image(encode(pixels), 32, 3, whole).numpy()
        np.testing.assert_allclose(pixels_of(out, whole), pixels, atol=atol)


def training_pixels(out: Path, channels: int) -> np.ndarray:
    """Every training image stored in ``out``'s shards, decoded to ``channels``, stacked."""
    images = []
    for path in sorted(out.glob("train-*.tfrecord")):
        for record in tf.data.TFRecordDataset(str(path)).as_numpy_iterator():
            example = tf.train.Example.FromString(record)
            encoded = example.features.feature["image/encoded"].bytes_list.value[0]
            images.append(tf.io.decode_image(encoded, channels=channels).numpy())
    return np.stack(images).astype(np.float64)


@pytest.mark.parametrize("encoding", ["keep", "jpeg"])
def test_converter_records_training_statistics_and_training_uses_them(tmp_path, encoding):
    rng = np.random.default_rng(4)
    images = {}
    for k in range(12):  # channels with clearly different means
        pixels = rng.integers(0, 120, (16, 16, 3)) + np.array([0, 60, 130])
        images[f"in/c{k % 2}/i{k}"] = pixels.astype(np.uint8)
    write_folder(tmp_path, images)
    out = tmp_path / "out"
    folder_to_tfrecord.convert(str(tmp_path / "in"), str(out), 2, 1, encoding=encoding,
                               validation_fraction=0.25)
    manifest = json.loads((out / "manifest.json").read_text())
    for channels in (3, 1):
        expected = training_pixels(out, channels).reshape(-1, channels)
        entry = manifest["pixel_stats"][str(channels)]
        assert entry["pixels"] == 8 * 16 * 16
        np.testing.assert_allclose(entry["mean"], expected.mean(axis=0), rtol=1e-9)
        np.testing.assert_allclose(entry["std"], expected.std(axis=0), rtol=1e-9)
    cfg = config(out, "imagenet", augment="none", num_classes=2, shuffle_buffer=0)
    batches = PIPELINES.get("imagenet")(cfg, ONE, "train", 1)
    assert batches.examples == 8
    seen = np.concatenate([x for x, _ in batches.dataset.take(8).as_numpy_iterator()])
    np.testing.assert_allclose(seen.mean(axis=(0, 1, 2)), 0, atol=1e-4)
    np.testing.assert_allclose(seen.std(axis=(0, 1, 2)), 1, atol=1e-4)


def test_stats_tool_on_an_image_folder_feeds_image_folder_normalization(tmp_path, capsys):
    images = {f"train/c{k % 2}/i{k}": random_image(10 + k) // 2 for k in range(6)}
    images["validation/c0/v"] = random_image(99)  # not training data: not counted
    write_folder(tmp_path, images)
    assert stats.main(["--data_dir", str(tmp_path)]) == 0
    assert "6 training images" in capsys.readouterr().out
    document = json.loads((tmp_path / "stats.json").read_text())
    train_pixels = np.stack([v for k, v in images.items() if k.startswith("train")])
    np.testing.assert_allclose(document["pixel_stats"]["3"]["mean"],
                               train_pixels.reshape(-1, 3).mean(axis=0), rtol=1e-9)
    cfg = config(tmp_path, "image_folder", augment="none", num_classes=2, shuffle_buffer=0)
    batches = PIPELINES.get("image_folder")(cfg, ONE, "train", 6)
    seen = next(batches.dataset.as_numpy_iterator())[0]
    np.testing.assert_allclose(seen.mean(axis=(0, 1, 2)), 0, atol=1e-4)
    np.testing.assert_allclose(seen.std(axis=(0, 1, 2)), 1, atol=1e-4)


def test_dataset_normalization_without_statistics_names_the_files_and_the_flag(tmp_path):
    write_folder(tmp_path, {f"c{k}/i": random_image(k) for k in range(2)})
    cfg = config(tmp_path, "image_folder", num_classes=2, normalization="dataset")
    with pytest.raises(ValueError, match=rf"--normalization=dataset.*stats\.json.*"
                                         rf"--data_dir={tmp_path}"):
        PIPELINES.get("image_folder")(cfg, ONE, "train", 1)
    # auto falls back to the ImageNet statistics
    cfg = cfg.replace(normalization="auto")
    assert PIPELINES.get("image_folder")(cfg, ONE, "train", 1).examples == 2


def test_preview_writes_a_png_grid_of_training_and_evaluation_images(tmp_path, capsys):
    images = {f"train/c{k % 2}/i{k}": random_image(20 + k) for k in range(4)}
    images |= {f"validation/c{k}/v": random_image(30 + k) for k in range(2)}
    write_folder(tmp_path, images)
    out = tmp_path / "grid.png"
    assert preview.main(["preview", "--dataset=image_folder", f"--data_dir={tmp_path}",
                         "--image_size=16", "--num_classes=2", "--augment=none",
                         "--normalization=none", f"--out={out}", "--rows=2",
                         "--columns=3", "--deterministic"]) == 0
    assert str(out) in capsys.readouterr().out
    grid = tf.io.decode_png(out.read_bytes()).numpy()
    tile = 64  # 16 px enlarged 4x
    section = preview.BAND + 2 * (tile + preview.LABEL) + 3 * preview.GAP
    assert grid.shape == (2 * section, 3 * tile + 4 * preview.GAP, 3)
    # The first evaluation tile; --deterministic fixes the order (the parallel decode may
    # reorder the images on a loaded machine otherwise).
    top = section + preview.BAND + preview.GAP
    first = grid[top:top + tile:4, preview.GAP:preview.GAP + tile:4]
    np.testing.assert_array_equal(first, images["validation/c0/v"])
    # Under it, its class: the strip holds the label "0: c0" as preview.tile_label draws it.
    strip = grid[top + tile:top + tile + preview.LABEL, preview.GAP:preview.GAP + tile]
    np.testing.assert_array_equal(strip, preview.tile_label("0: c0", tile))
    assert (strip > 200).any() and not np.array_equal(strip, preview.tile_label("1: c1", tile))
    assert preview.class_labels(np.array([1, 0, 7]), ["cat", "dog"]) == ["1: dog", "0: cat", "7"]
    assert preview.class_labels(np.array([2]), ["0", "1", "2"]) == ["2"]
    assert preview.main(["preview", "--dataset=synthetic_segmentation", f"--out={out}"]) == 2


def test_preview_takes_the_dataset_and_shapes_from_the_data(tmp_path, capsys):
    write_folder(tmp_path, {f"{split}/c{k}/i": random_image(k, 20, 20)
                            for split in ("train", "validation") for k in range(3)})
    out = tmp_path / "grid.png"
    assert preview.main(["preview", f"--data_dir={tmp_path}", f"--out={out}", "--rows=1",
                         "--columns=3"]) == 0
    printed = capsys.readouterr()
    assert "using --dataset=image_folder" in printed.err
    assert "--image_size=20 (its training images are 20x20), --num_classes=3" in printed.out
    assert (f"wrote {out}: TRAIN (training images as the model gets them, not augmented: "
            "--augment=none) above EVAL") in printed.out
    tile = 80  # 20 px enlarged 4x
    assert tf.io.decode_png(out.read_bytes()).shape[1] == 3 * tile + 4 * preview.GAP
    assert preview.main(["preview", f"--data_dir={tmp_path}", f"--out={out}", "--rows=1",
                         "--columns=1", "--image_size=64", "--augment=small"]) == 0
    assert ("TRAIN (training images augmented by --augment=small with random flips)"
            in capsys.readouterr().out)
