"""The model_dir's model for inference: raw images in, the evaluation's predictions out.

At the end of training the chief writes ``MODEL_DIR/export/``, a TensorFlow SavedModel whose
``serve`` endpoint (also its ``serving_default`` signature) takes a batch of raw inputs
``[N, H, W, C]`` of one size (uint8 images for classification, float32 samples for
segmentation), applies the preprocessing evaluation applies to the validation split (the
dataset's, see :mod:`input_pipelines.core.inference`), runs the trained model in inference mode
and returns ``logits`` and ``probabilities`` (softmax over the classes; per pixel for
segmentation). ``export/inference.json`` says what it expects and holds the class names.
Loading it needs TensorFlow only::

    served = tf.saved_model.load("MODEL_DIR/export")
    probabilities = served.serve(images)["probabilities"]      # images: uint8 [N, H, W, 3]

``python -m tfscale.predict`` (:mod:`tfscale.predict`) reads images and prints its predictions.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import keras
    import tensorflow as tf

# TensorFlow is imported by the functions that need it: python -m tfscale.predict reads these
# names and answers bad usage before TensorFlow loads.
EXPORT = "export"  # under the model_dir
INFO = "inference.json"  # inside the export


def plain_copy(model: keras.Model) -> keras.Model:
    """An uncompiled copy of ``model`` with its weights, outside any strategy's scope.

    The optimizer, its schedule and the loss are tfscale objects that plain Keras would not
    know, and the training state is in the checkpoints anyway.
    """
    plain = type(model).from_config(model.get_config())
    plain.set_weights(model.get_weights())
    return plain


def _replace_dir(tmp: Path, path: Path) -> None:
    """Puts the finished directory ``tmp`` at ``path``: each rename is atomic, so a reader sees
    the old export or the new one, never a partial one (at worst, between the two renames,
    none)."""
    old = path.with_name(f".old-{os.getpid()}-{path.name}")
    if path.exists():
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def export_inference(model: keras.Model, path: Path,
                     preprocess: Callable[[tf.Tensor], tf.Tensor], dtype: str, channels: int,
                     info: dict[str, Any]) -> float:
    """Writes the SavedModel of ``preprocess`` then ``model`` at ``path``, atomically.

    Args:
        model: the trained model (a plain copy, see :func:`plain_copy`).
        path: the export directory (``MODEL_DIR/export``).
        preprocess: raw ``[N, H, W, channels]`` batch of ``dtype`` -> the model's input.
        dtype: ``uint8`` or ``float32``.
        channels: C of the raw input.
        info: written to ``path/inference.json`` (with ``input`` and ``outputs`` added).

    Returns:
        The seconds the export took.
    """
    import tensorflow as tf

    start = time.perf_counter()

    def serve(raw: tf.Tensor) -> dict[str, tf.Tensor]:
        logits = tf.cast(model(preprocess(raw), training=False), tf.float32)
        return {"logits": logits, "probabilities": tf.nn.softmax(logits, axis=-1)}

    # A plain module rather than keras.export.ExportArchive: the archive traces the model
    # once more to find its resources, which tripled the export's time (resnet50_tiny: 16.6 s
    # of CPU against 5.1 s).
    module = tf.Module()
    module.model_variables = list(model.variables)
    module.serve = tf.function(serve, input_signature=[
        tf.TensorSpec([None, None, None, channels], dtype, name="images")])
    tmp = path.with_name(f".tmp-{os.getpid()}-{path.name}")
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tf.saved_model.save(module, str(tmp), signatures={"serving_default": module.serve})
        document = {**info, "input": {"dtype": dtype, "shape": [None, None, None, channels]},
                    "outputs": ["logits", "probabilities"]}
        (tmp / INFO).write_text(json.dumps(document, indent=2) + "\n")
        _replace_dir(tmp, path)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return time.perf_counter() - start
