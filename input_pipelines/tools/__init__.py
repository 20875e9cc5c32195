"""Command-line tools that prepare and check data (run each with ``python -m
input_pipelines.tools.NAME``): ``folder_to_tfrecord``, ``folder_to_lmdb``,
``segmentation_to_tfrecord``, ``stats``, ``class_weights``, ``preview``, ``synthetic_h5``, and
``io_check`` (whether storage, the input pipeline or the model limits training)."""
