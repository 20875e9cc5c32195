"""Atomic, rotating checkpoints with fallback past a corrupt file."""

from __future__ import annotations

from pathlib import Path

import keras
import numpy as np
import pytest

from tfscale.exchange.interface import Entry
from tfscale.training.checkpointing import CheckpointError, CheckpointManager


def _vars(seed: int) -> list[keras.Variable]:
    rng = np.random.default_rng(seed)
    return [keras.Variable(rng.normal(size=(3, 2)).astype("float32"), name="kernel"),
            keras.Variable(rng.normal(size=(2,)).astype("float32"), name="bias")]


def test_save_restore_rotate(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep=2)
    saved = {}
    for step in (1, 2, 3):
        variables = _vars(step)
        manager.save(step, variables, {"epoch": step})
        saved[step] = [v.numpy().copy() for v in variables]
    assert manager.steps() == [3, 2]
    assert not list(tmp_path.glob(".*tmp*"))
    target = _vars(99)
    meta = manager.restore(target)
    assert meta is not None and meta["step"] == 3 and meta["epoch"] == 3
    for got, want in zip(target, saved[3], strict=True):
        np.testing.assert_array_equal(got.numpy(), want)


def test_optional_entries_are_restored_by_path_where_asked_and_ignored_elsewhere(
        tmp_path: Path) -> None:
    # The gradient lag's pending gradients: saved as values, restored into tf.Variables.
    import tensorflow as tf

    manager = CheckpointManager(tmp_path / "with")
    pending = np.arange(6, dtype="float32").reshape(3, 2)
    manager.save(1, _vars(1), optional=[Entry("gradient_lag/kernel", pending)])
    slot = Entry("gradient_lag/kernel", tf.Variable(tf.zeros((3, 2))))
    other = Entry("gradient_lag/bias", tf.Variable(tf.ones((2,))))
    target = _vars(99)
    meta = manager.restore(target, optional=[slot, other])
    assert meta is not None and meta["restored_optional"] == ["gradient_lag/kernel"]
    np.testing.assert_array_equal(slot.value.numpy(), pending)
    np.testing.assert_array_equal(other.value.numpy(), np.ones(2))  # not in it: kept as it was
    np.testing.assert_array_equal(target[0].numpy(), _vars(1)[0].numpy())
    # A run without the lag restores the variables and leaves the pending gradients out.
    assert manager.restore(_vars(98))["restored_optional"] == []  # type: ignore[index]
    # A checkpoint without them restores into a run with the lag, which is told.
    plain = CheckpointManager(tmp_path / "without")
    plain.save(1, _vars(1))
    assert plain.restore(_vars(97), optional=[slot])["restored_optional"] == []  # type: ignore[index]
    # A pending gradient of the wrong shape is refused like a variable.
    wrong = Entry("gradient_lag/kernel", tf.Variable(tf.zeros((2, 3))))
    with pytest.raises(CheckpointError, match="variable gradient_lag/kernel has shape"):
        manager.restore(_vars(96), optional=[wrong])


def test_corrupt_latest_falls_back_with_warning(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path, keep=3)
    manager.save(1, _vars(1))
    good = [v.numpy().copy() for v in _vars(1)]
    manager.save(2, _vars(2))
    latest = manager.path(2)
    latest.write_bytes(latest.read_bytes()[: latest.stat().st_size // 2])
    target = _vars(7)
    with pytest.warns(UserWarning, match=f"checkpoint {latest} is unreadable"):
        meta = manager.restore(target)
    assert meta is not None and meta["step"] == 1
    np.testing.assert_array_equal(target[0].numpy(), good[0])


def test_no_checkpoint_and_unusable_checkpoints(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path / "none")
    assert manager.restore(_vars(0)) is None
    manager = CheckpointManager(tmp_path)
    manager.save(5, _vars(5))
    manager.path(5).write_bytes(b"garbage")
    with pytest.warns(UserWarning):
        with pytest.raises(CheckpointError, match="no readable checkpoint"):
            manager.restore(_vars(0))


def test_mismatched_model_is_refused(tmp_path: Path) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(1, _vars(1))
    other = [keras.Variable(np.zeros((4, 2), "float32")), keras.Variable(np.zeros(2, "float32"))]
    with pytest.raises(CheckpointError, match=r"has shape \(3, 2\).*use another --model_dir"):
        manager.restore(other)
    with pytest.raises(CheckpointError, match="holds 2 variables, the model and optimizer have 1"):
        manager.restore(other[:1])


def test_failed_write_keeps_previous(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    manager = CheckpointManager(tmp_path)
    manager.save(1, _vars(1))

    def disk_full(*args: object, **kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(np, "savez", disk_full)
    with pytest.raises(OSError, match="No space left"):
        manager.save(2, _vars(2))
    assert manager.steps() == [1] and not list(tmp_path.glob(".*tmp*"))
    assert manager.restore(_vars(0))["step"] == 1  # type: ignore[index]
