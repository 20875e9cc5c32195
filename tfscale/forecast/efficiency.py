"""Statistical efficiency: epochs (and optimizer steps) to a target accuracy at each global batch.

More nodes at a fixed batch per rank mean a larger global batch, and past some batch each
step buys less progress (Shallue et al. 2019, "Measuring the Effects of Data Parallelism on
Neural Network Training", JMLR 20(112)): the run needs more epochs. Time to the target is
``epochs x training images / images per second``, so it has a minimum over node counts even
where images/s keeps growing. This module holds that curve, from either source:

- a file written by ``python -m bench.statistical_scaling`` or by the user (``--efficiency``)::

      {"dataset": "digits", "model": "resnet50_tiny",
       "target": {"metric": "val_accuracy", "value": 0.9}, "source": "...",
       "per_worker_batch": 16, "train_images": 1438,
       "points": [{"global_batch": 16, "epochs_to_target": 3.2, "steps_to_target": 288,
                   "seeds": 3, "reached": 3}, ...]}

  ``epochs_to_target`` is null where no seed reached the target; ``train_images`` may be left
  out when the points give ``steps_to_target`` (then it is ``steps x global batch / epochs``);
- the published ImageNet table (:meth:`tfscale.forecast.accuracy.AccuracyTable.curve`).

Between two measured batches that both reached the target, epochs are interpolated linearly in
log(epochs) against log(global batch): both perfect scaling (constant epochs) and the regime
where steps stop falling (epochs proportional to the batch) are straight lines there. Outside
the measured batches, or next to a batch where the target was not reached, nothing is known
and :meth:`EpochsCurve.unknown` says why in words; there is no extrapolation. Where only some
seeds of a measured batch reached the target, :meth:`EpochsCurve.caution` says so.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from pathlib import Path
from typing import Any

from tfscale.forecast import files

DATA_DIR = Path(__file__).with_name("data")


@dataclasses.dataclass(frozen=True)
class Point:
    """One measured global batch: epochs to the target (None where it was not reached)."""

    global_batch: int
    epochs: float | None
    seeds: int | None = None
    reached: int | None = None


@dataclasses.dataclass(frozen=True)
class EpochsCurve:
    """Epochs to a target against the global batch, measured at a few batches."""

    model: str
    dataset: str
    target: str  # in words, e.g. "val_accuracy >= 0.9"
    train_images: int
    points: tuple[Point, ...]  # by global batch
    path: Path
    source: str = ""

    def _around(self, global_batch: int) -> tuple[Point, Point]:
        """The measured points at or on either side of ``global_batch`` (inside the range)."""
        for low, high in zip(self.points, self.points[1:], strict=False):
            if low.global_batch <= global_batch <= high.global_batch:
                return low, high
        return self.points[0], self.points[0]

    def _resting_on(self, global_batch: int) -> list[Point]:
        """The measured points the epochs at ``global_batch`` come from: that batch's, or the
        two around it (inside the range)."""
        low, high = self._around(global_batch)
        return [p for p in (low, high) if p.global_batch == global_batch] or [low, high]

    def unknown(self, global_batch: int) -> str:
        """Why the curve knows no epochs at ``global_batch``, in words; "" when it does."""
        name, first, last = self.path.name, self.points[0], self.points[-1]
        if not first.global_batch <= global_batch <= last.global_batch:
            side = (f"above {last.global_batch:,}, the largest" if global_batch > last.global_batch
                    else f"below {first.global_batch:,}, the smallest")
            return (f"{name} measured no global batch {side} it has, so the epochs to "
                    f"{self.target} there are not known (no extrapolation)")
        missed = [p for p in self._resting_on(global_batch) if p.epochs is None]
        if missed:
            return (f"{name}: no seed reached {self.target} at global batch "
                    f"{missed[0].global_batch:,}, so the epochs there are not known")
        return ""

    def caution(self, global_batch: int) -> str:
        """Where the epochs at ``global_batch`` rest on a measured batch at which only some
        seeds reached the target (their mean: the others never got there, so the figure is
        optimistic), in words; "" otherwise, or where the epochs are not known at all."""
        if self.unknown(global_batch):
            return ""
        short = [p for p in self._resting_on(global_batch)
                 if p.seeds is not None and p.reached is not None and p.reached < p.seeds]
        if not short:
            return ""
        point = short[0]
        return (f"{self.path.name}: only {point.reached} of {point.seeds} seeds reached "
                f"{self.target} at global batch {point.global_batch:,}; the epochs there are "
                "the mean of those that did (optimistic)")

    def epochs(self, global_batch: int) -> float | None:
        """Epochs to the target at ``global_batch`` (log-log interpolation between measured
        batches); None where :meth:`unknown` gives a reason."""
        if self.unknown(global_batch):
            return None
        low, high = self._around(global_batch)
        if global_batch in (low.global_batch, high.global_batch):
            return low.epochs if global_batch == low.global_batch else high.epochs
        assert low.epochs is not None and high.epochs is not None  # unknown() said so
        t = math.log(global_batch / low.global_batch) / math.log(high.global_batch
                                                                 / low.global_batch)
        return math.exp((1 - t) * math.log(low.epochs) + t * math.log(high.epochs))

    def minutes(self, global_batch: int, images_per_sec: float) -> float | None:
        """Training minutes to the target at a throughput; None where the epochs are unknown."""
        epochs = self.epochs(global_batch)
        if epochs is None:
            return None
        return epochs * self.train_images / images_per_sec / 60.0


def resolve(name_or_path: str) -> Path:
    """``--efficiency``: a file, or the name of a shipped one (``digits`` is
    ``data/efficiency_digits.json``).

    Raises:
        ValueError: naming the flag's value and the shipped names.
    """
    return files.resolve("efficiency", name_or_path, DATA_DIR, "efficiency_", "shipped curve")


def load(name_or_path: str) -> EpochsCurve:
    """Reads and validates a statistical-efficiency file.

    Raises:
        ValueError: naming the file and the bad field.
    """
    path = resolve(name_or_path)
    doc: Any = files.read("efficiency", path)
    return parse(doc, path)


def _number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def parse(doc: Any, path: Path) -> EpochsCurve:
    """Validates a statistical-efficiency document read from ``path``.

    Raises:
        ValueError: naming the file and the bad field.
    """
    def fail(field: str, problem: str) -> ValueError:
        return ValueError(f"{path}: field '{field}' {problem}")

    if not isinstance(doc, dict):
        raise fail("(top level)", "must be a JSON object")
    for key in ("model", "target", "points"):
        if key not in doc:
            raise fail(key, "is missing")
    target = doc["target"]
    if not isinstance(target, dict) or "metric" not in target or not _number(target.get("value")):
        raise fail("target", f"must be {{\"metric\": NAME, \"value\": NUMBER}}, got {target!r}")
    if not isinstance(doc["points"], list) or not doc["points"]:
        raise fail("points", "must be a non-empty list")
    points, images = [], []
    for i, row in enumerate(doc["points"]):
        where = f"points[{i}]"
        if not isinstance(row, dict) or "global_batch" not in row or "epochs_to_target" not in row:
            raise fail(where, "needs global_batch and epochs_to_target (null where not reached)")
        batch, epochs = row["global_batch"], row["epochs_to_target"]
        if not isinstance(batch, int) or isinstance(batch, bool) or batch < 1:
            raise fail(f"{where}.global_batch", f"must be a whole number >= 1, got {batch!r}")
        if epochs is not None and (not _number(epochs) or epochs <= 0):
            raise fail(f"{where}.epochs_to_target", f"must be a number > 0 or null, got {epochs!r}")
        steps: Any = row.get("steps_to_target")
        if epochs is not None and _number(steps) and steps > 0:
            images.append(steps * batch / epochs)
        points.append(Point(batch, None if epochs is None else float(epochs),
                            row.get("seeds"), row.get("reached")))
    points.sort(key=lambda p: p.global_batch)
    if len({p.global_batch for p in points}) != len(points):
        raise fail("points", "has a global_batch twice")
    train_images = doc.get("train_images")
    if train_images is None:
        if not images:
            raise fail("train_images", "is missing, and no point gives steps_to_target with "
                       "its epochs to derive it from")
        train_images = round(statistics.median(images))
    elif not isinstance(train_images, int) or train_images < 1:
        raise fail("train_images", f"must be a whole number >= 1, got {train_images!r}")
    return EpochsCurve(str(doc["model"]), str(doc.get("dataset", "")),
                       f"{target['metric']} >= {target['value']:g}", int(train_images),
                       tuple(points), path, str(doc.get("source", "")))
