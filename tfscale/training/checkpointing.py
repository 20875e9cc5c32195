"""Atomic, rotating checkpoints of a model's and optimizer's variables.

Each checkpoint is one ``ckpt-<step>.npz`` file (NumPy zip: every member has a CRC, so a
truncated or corrupted file is detected on load). It is written under a temporary name, flushed
to disk and renamed, so a crash or a full disk during the write leaves the previous checkpoint
as it was. The newest ``keep`` are kept. Restoring tries the newest first and falls back to the
one before it, with a warning, when a file is unreadable.
"""

from __future__ import annotations

import json
import os
import re
import warnings
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

_NAME = re.compile(r"^ckpt-(\d+)\.npz$")


class CheckpointError(ValueError):
    """A checkpoint exists but cannot be used (corrupt, or for another model)."""


class CheckpointManager:
    """Saves and restores ``variables`` (Keras variables) under ``directory``.

    Args:
        directory: where checkpoint files live (created on first save).
        keep: how many of the newest checkpoints to keep.
    """

    def __init__(self, directory: str | os.PathLike[str], keep: int = 3) -> None:
        if keep < 1:
            raise ValueError(f"keep={keep}; expected at least 1")
        self.directory = Path(directory)
        self.keep = keep

    def steps(self) -> list[int]:
        """Steps of the checkpoints on disk, newest first."""
        if not self.directory.is_dir():
            return []
        found = (_NAME.match(p.name) for p in self.directory.iterdir())
        return sorted((int(m.group(1)) for m in found if m), reverse=True)

    def path(self, step: int) -> Path:
        return self.directory / f"ckpt-{step:09d}.npz"

    def save(self, step: int, variables: Sequence[Any], meta: dict[str, Any] | None = None,
             optional: Sequence[Any] = ()) -> Path:
        """Writes the values of ``variables`` as the checkpoint of ``step``, atomically.

        ``optional`` entries (training state that only some runs have, such as the gradient
        lag's pending gradients) are saved after them and marked so: a restore takes them by
        path where it asks for them and leaves them out of its match otherwise.

        Raises:
            CheckpointError: when a variable holds NaN/Inf (a diverged state is never saved,
                so it cannot replace the last good checkpoint).
            OSError: when writing fails (the previous checkpoints are untouched).
        """
        variables = [*variables, *optional]
        arrays = {f"v{i:05d}": np.asarray(v.numpy()) for i, v in enumerate(variables)}
        for variable, value in zip(variables, arrays.values(), strict=True):
            if value.dtype.kind == "f" and not np.all(np.isfinite(value)):
                raise CheckpointError(f"not saving step {step}: variable {variable.path} "
                                      "holds NaN/Inf")
        self.directory.mkdir(parents=True, exist_ok=True)
        info = {"step": step, "paths": [v.path for v in variables],
                "optional": [v.path for v in optional], **(meta or {})}
        arrays["__meta__"] = np.frombuffer(json.dumps(info).encode(), dtype=np.uint8)
        final = self.path(step)
        tmp = final.with_name(f".{final.name}.tmp-{os.getpid()}")
        try:
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)  # type: ignore[arg-type]
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, final)
        finally:
            tmp.unlink(missing_ok=True)
        self._rotate()
        return final

    def _rotate(self) -> None:
        for step in self.steps()[self.keep:]:
            self.path(step).unlink(missing_ok=True)
        # Temporary files of writers that were killed mid-write.
        for stale in self.directory.glob(".ckpt-*.npz.tmp-*"):
            if not stale.name.endswith(f".tmp-{os.getpid()}"):
                stale.unlink(missing_ok=True)

    def read(self, step: int) -> tuple[dict[str, Any], list[np.ndarray]]:
        """The metadata and arrays of checkpoint ``step``.

        Raises:
            CheckpointError: naming the file, when it is truncated or corrupt.
        """
        path = self.path(step)
        try:
            with np.load(path) as data:
                meta = json.loads(bytes(data["__meta__"]).decode())
                arrays = [data[f"v{i:05d}"] for i in range(len(meta["paths"]))]
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile) as err:
            raise CheckpointError(f"checkpoint {path} is unreadable: {err}") from err
        return meta, arrays

    def restore(self, variables: Sequence[Any],
                optional: Sequence[Any] = ()) -> dict[str, Any] | None:
        """Loads the newest usable checkpoint into ``variables``, and into each of ``optional``
        that the checkpoint holds an optional entry of the same path for (the others keep
        their values).

        Returns:
            The checkpoint's metadata (with ``step``, and ``restored_optional``: the paths of
            ``optional`` it restored), or None when there is no checkpoint.

        Raises:
            CheckpointError: when checkpoints exist but none is usable, or when one was saved
                from different variables (another model or optimizer).
        """
        steps = self.steps()
        for step in steps:
            try:
                meta, arrays = self.read(step)
            except CheckpointError as err:
                warnings.warn(f"{err}; falling back to the previous checkpoint", stacklevel=2)
                continue
            marked = set(meta.get("optional", ()))
            entries = list(zip(meta["paths"], arrays, strict=True))
            saved = {name: value for name, value in entries if name in marked}
            required = [(name, value) for name, value in entries if name not in marked]
            wanted = [v for v in optional if v.path in saved]
            targets = [*variables, *wanted]
            values = [*(value for _, value in required), *(saved[v.path] for v in wanted)]
            self._check_matches(self.path(step), [*(name for name, _ in required),
                                                  *(v.path for v in wanted)], values, targets)
            for variable, value in zip(targets, values, strict=True):
                variable.assign(value)
            meta["restored_optional"] = [v.path for v in wanted]
            return meta
        if steps:
            raise CheckpointError(f"no readable checkpoint in {self.directory} "
                                  f"(tried steps {steps})")
        return None

    @staticmethod
    def _check_matches(
        path: Path, paths: list[str], arrays: list[np.ndarray], variables: Sequence[Any]
    ) -> None:
        if len(paths) != len(variables):
            raise CheckpointError(
                f"checkpoint {path} holds {len(paths)} variables, the model and optimizer have "
                f"{len(variables)}: it was written for another model/optimizer; use another "
                "--model_dir"
            )
        for name, value, variable in zip(paths, arrays, variables, strict=True):
            if tuple(value.shape) != tuple(variable.shape):
                raise CheckpointError(
                    f"checkpoint {path}: variable {name} has shape {tuple(value.shape)}, the "
                    f"model's {variable.path} has {tuple(variable.shape)}; use another "
                    "--model_dir"
                )
