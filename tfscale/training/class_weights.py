"""Per-class loss weights: reading ``--class_weights`` and computing weights from class counts.

``--class_weights`` is either comma-separated numbers (``0.1,1,5``) or the path of a JSON file:
a list of numbers, or an object whose ``class_weights`` is one (what
``python -m input_pipelines.tools.class_weights`` writes). Weights come from the class
frequencies ``f``:

- ``inverse``: ``1 / f``
- ``inverse_sqrt``: ``1 / sqrt(f)``
- ``deepcam``: ``f ** -0.125`` (the MLPerf HPC DeepCAM reference's weighting)

normalized so that the frequency-weighted mean weight ``sum(f * w)`` is 1: the weighted loss of
a typical batch stays on the scale of the unweighted loss, so learning rates carry over. A class
absent from the counts gets the largest weight of the present ones.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

METHODS = ("inverse", "inverse_sqrt", "deepcam")
_EXPONENTS = {"inverse": 1.0, "inverse_sqrt": 0.5, "deepcam": 0.125}


def parse_class_weights(text: str, num_classes: int) -> tuple[float, ...] | None:
    """The weights ``--class_weights=text`` gives, or ``None`` when it is empty.

    Raises:
        ValueError: naming the value when it is neither numbers nor a readable JSON file of
            them, or when the weights are not ``num_classes`` finite, non-negative numbers
            with a positive sum.
    """
    if not text.strip():
        return None
    items = [item.strip() for item in text.split(",")]
    try:
        weights = [float(item) for item in items]
        source = f"--class_weights={text!r}"
    except ValueError:
        if not (os.path.exists(text) or text.endswith(".json")):
            bad = next(item for item in items if not _is_number(item))
            raise ValueError(
                f"--class_weights={text!r} is neither comma-separated numbers "
                f"({bad!r} is not a number) nor an existing JSON file"
            ) from None
        weights = _read_file(text)
        source = f"--class_weights file {text!r}"
    return validate_class_weights(weights, num_classes, source)


def _is_number(item: str) -> bool:
    try:
        float(item)
    except ValueError:
        return False
    return True


def _read_file(path: str) -> list[Any]:
    try:
        with open(path, encoding="utf-8") as handle:
            document = json.load(handle)
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--class_weights file {path!r} cannot be read: {err}") from None
    except json.JSONDecodeError as err:
        raise ValueError(f"--class_weights file {path!r} is not valid JSON: {err}") from None
    if isinstance(document, dict):
        document = document.get("class_weights")
    if not isinstance(document, list):
        raise ValueError(
            f"--class_weights file {path!r} holds neither a list of numbers nor an "
            "object with a 'class_weights' list"
        )
    return document


def validate_class_weights(
    weights: Sequence[Any], num_classes: int, source: str = "class weights"
) -> tuple[float, ...]:
    """Checks ``weights`` and returns them as floats.

    Raises:
        ValueError: naming ``source`` and the bad value.
    """
    if len(weights) != num_classes:
        raise ValueError(
            f"{source} has {len(weights)} weights {list(weights)} but "
            f"--num_classes={num_classes}; give one weight per class"
        )
    values = []
    for cls, weight in enumerate(weights):
        if isinstance(weight, bool) or not isinstance(weight, (int, float)):
            raise ValueError(f"{source}: weight {weight!r} of class {cls} is not a number")
        if not math.isfinite(weight) or weight < 0:
            raise ValueError(
                f"{source}: weight {weight!r} of class {cls} is not valid; weights "
                "must be finite and >= 0"
            )
        values.append(float(weight))
    if not sum(values) > 0:
        raise ValueError(f"{source}: all weights are 0; at least one class must count")
    return tuple(values)


def weights_from_counts(counts: Sequence[int], method: str) -> list[float]:
    """Normalized class weights from per-class pixel ``counts`` (see the module docstring).

    Raises:
        ValueError: for an unknown method or counts without any pixel.
    """
    if method not in METHODS:
        raise ValueError(f"method {method!r} is not valid; choose one of: {', '.join(METHODS)}")
    totals = np.asarray(counts, dtype=np.float64)
    if totals.sum() <= 0:
        raise ValueError(f"pixel counts {list(counts)} are empty; nothing to weight")
    frequencies = totals / totals.sum()
    present = frequencies > 0
    weights = np.zeros_like(frequencies)
    weights[present] = frequencies[present] ** -_EXPONENTS[method]
    weights[~present] = weights[present].max()
    weights /= np.sum(frequencies * weights)
    return [float(w) for w in weights]
