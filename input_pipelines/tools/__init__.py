"""Command-line tools that prepare and check data (run each with ``python -m
input_pipelines.tools.NAME``): ``folder_to_tfrecord``, ``folder_to_lmdb``,
``segmentation_to_tfrecord``, ``stats``, ``class_weights``, ``preview``, ``synthetic_h5``, and
``io_check`` (whether storage, the input pipeline or the model limits training)."""

from __future__ import annotations

from collections.abc import Sequence

from absl import flags


def parse_tool_flags(values: flags.FlagValues, argv: Sequence[str], doc: str | None) -> bool:
    """Parses a tool's ``argv`` into ``values``; prints ``doc`` and the flags and returns True
    for ``--help`` (the tool then exits 0).

    Raises:
        flags.Error: a bad flag value.
        ValueError: arguments that are not flags.
    """
    if {"--help", "-h", "--helpfull"} & set(argv):
        print(f"{doc}\n{values.get_help()}")
        return True
    rest = values(list(argv))
    if len(rest) > 1:
        raise ValueError(f"unexpected arguments {rest[1:]}; all options are --flags")
    return False
