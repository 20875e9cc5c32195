"""Time to accuracy: epochs a model needs at a global batch, from a small cited table.

The rule the default table encodes (ResNet-50 on ImageNet): up to about 8K images per step the
linear scaling rule with a gradual warmup keeps the small-batch accuracy in the same 90 epochs
(Goyal et al. 2017); beyond that LARS (You et al. 2017) is needed, and the larger batch costs
epochs or accuracy. Between rows, top-1 is interpolated in log2 of the batch and epochs in log-log
(:mod:`tfscale.forecast.efficiency`);
outside the rows nothing is known (no published run), and :meth:`AccuracyTable.unknown` says
so in words instead of a guess. A user's own table (``--accuracy_table FILE``) replaces the
default one::

    {"model": "resnet50", "dataset": "imagenet", "train_images": 1281167, "lars_above": 8192,
     "rows": [{"global_batch": 8192, "epochs": 90, "top1": 0.763, "source": "..."}, ...]}
"""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

from tfscale.forecast import files
from tfscale.forecast.efficiency import EpochsCurve, Point

DEFAULT_TABLE = Path(__file__).with_name("data") / "accuracy_resnet50_imagenet.json"


@dataclasses.dataclass(frozen=True)
class Epochs:
    """Epochs to the table's accuracy at one global batch."""

    global_batch: int
    epochs: float
    top1: float
    optimizer: str  # the rule in force: linear scaling + warmup, or LARS


@dataclasses.dataclass(frozen=True)
class AccuracyTable:
    """A validated epochs-per-batch table."""

    model: str
    train_images: int
    lars_above: int
    rows: tuple[tuple[int, float, float], ...]  # (global batch, epochs, top-1), by batch
    path: Path
    dataset: str = ""

    def unknown(self, global_batch: int) -> str:
        """Why the table knows no accuracy at ``global_batch``, in words; "" when it does."""
        low, high = self.rows[0][0], self.rows[-1][0]
        if low <= global_batch <= high:
            return ""
        side = (f"above {high:,}, its largest" if global_batch > high
                else f"below {low:,}, its smallest")
        return (f"the accuracy table ({self.path.name}) has no published run at a global batch "
                f"{side}, so neither the epochs nor the accuracy there are known")

    def at(self, global_batch: int) -> Epochs | None:
        """Epochs (as :meth:`curve` interpolates them) and expected top-1 (linear in log2 of
        the batch between rows) at ``global_batch``; None outside the rows (see
        :meth:`unknown`)."""
        optimizer = "LARS" if global_batch > self.lars_above else "SGD, linear scaling + warmup"
        epochs = self.curve().epochs(global_batch)
        if self.unknown(global_batch) or epochs is None:
            return None
        top1 = self.rows[0][2]
        for (b0, _, a0), (b1, _, a1) in zip(self.rows, self.rows[1:], strict=False):
            if b0 <= global_batch <= b1:
                top1 = a0 + math.log2(global_batch / b0) / math.log2(b1 / b0) * (a1 - a0)
                break
        return Epochs(global_batch, epochs, top1, optimizer)

    def minutes(self, global_batch: int, images_per_sec: float) -> float | None:
        """Training minutes to the table's accuracy at a forecast throughput; None where the
        accuracy is not known."""
        return self.curve().minutes(global_batch, images_per_sec)

    def curve(self) -> EpochsCurve:
        """The table in a statistical-efficiency file's terms: epochs against the global batch
        (the target is each row's published top-1, which falls with the batch)."""
        tops = f"{self.rows[0][2]:.3f}" + (f" to {self.rows[-1][2]:.3f}" if len(self.rows) > 1
                                           else "")
        return EpochsCurve(self.model, self.dataset, f"the published top-1 ({tops})",
                           self.train_images, tuple(Point(b, e) for b, e, _ in self.rows),
                           self.path, "published rows")


def load_table(path: str | Path = DEFAULT_TABLE) -> AccuracyTable:
    """Reads and validates an accuracy table.

    Raises:
        ValueError: naming the file and the bad field.
    """
    path = Path(path)
    doc: Any = files.read("accuracy_table", path)

    def fail(field: str, problem: str) -> ValueError:
        return ValueError(f"{path}: field '{field}' {problem}")

    if not isinstance(doc, dict):
        raise fail("(top level)", "must be a JSON object")
    for key in ("model", "train_images", "rows"):
        if key not in doc:
            raise fail(key, "is missing")
    if not isinstance(doc["train_images"], int) or doc["train_images"] < 1:
        raise fail("train_images", f"must be a whole number >= 1, got {doc['train_images']!r}")
    if not isinstance(doc["rows"], list) or not doc["rows"]:
        raise fail("rows", "must be a non-empty list")
    rows = []
    for i, row in enumerate(doc["rows"]):
        for key in ("global_batch", "epochs", "top1", "source"):
            if not isinstance(row, dict) or key not in row:
                raise fail(f"rows[{i}].{key}", "is missing")
        numbers = (row["global_batch"], row["epochs"], row["top1"])
        if not all(isinstance(v, int | float) and v > 0 for v in numbers) or row["top1"] > 1:
            raise fail(f"rows[{i}]", "needs global_batch > 0, epochs > 0 and 0 < top1 <= 1, "
                       f"got {numbers}")
        rows.append((int(row["global_batch"]), float(row["epochs"]), float(row["top1"])))
    rows.sort()
    return AccuracyTable(str(doc["model"]), int(doc["train_images"]),
                         int(doc.get("lars_above", 8192)), tuple(rows), path,
                         str(doc.get("dataset", "")))
