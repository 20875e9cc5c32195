"""Command-line tools that prepare data (run each with ``python -m input_pipelines.tools.NAME``):
``folder_to_tfrecord``, ``segmentation_to_tfrecord``, ``stats``, ``class_weights``, ``preview``,
``synthetic_h5``."""
