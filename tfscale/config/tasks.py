"""The tasks a model solves and a dataset serves: the one list both registries and the losses use.

A model and a dataset fit together when they have the same task. ``classification``: one
integer label per image, logits ``[B, num_classes]``. ``segmentation``: a label per pixel,
logits ``[B, H, W, num_classes]``.
"""

from __future__ import annotations

CLASSIFICATION = "classification"
SEGMENTATION = "segmentation"
TASKS = (CLASSIFICATION, SEGMENTATION)


def check_task(task: str, what: str) -> str:
    """Returns ``task`` if it is one of :data:`TASKS`.

    Args:
        task: the task to check.
        what: what has the task, for the message (e.g. ``"model 'resnet50'"``).

    Raises:
        ValueError: naming ``what``, the bad task and the valid ones.
    """
    if task not in TASKS:
        raise ValueError(f"task {task!r} for {what}; expected one of: {', '.join(TASKS)}")
    return task
