"""The ``--skip_corrupt`` policy, in one place.

A damaged data file (truncated, failing its checksum, not decoding) fails the run with an error
that names it, unless ``--skip_corrupt`` is given: then the file is left out and the worker
reports once per split how many files it skipped and which. Every pipeline and the staging step
hand the damaged files they find to a :class:`CorruptFiles` and keep what it does not hold.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from input_pipelines.core import report
from input_pipelines.core.errors import CorruptFileError
from input_pipelines.registry import Shard

SHOWN = 3  # damaged files named in the report; the rest are counted


@dataclasses.dataclass
class CorruptFiles:
    """The damaged files found so far, under one ``--skip_corrupt`` setting."""

    skip: bool
    found: list[CorruptFileError] = dataclasses.field(default_factory=list)

    def add(self, error: CorruptFileError) -> None:
        """Records a damaged file.

        Raises:
            CorruptFileError: ``error`` itself, unless damaged files are skipped.
        """
        if not self.skip:
            raise error
        self.found.append(error)

    def add_all(self, errors: Iterable[CorruptFileError]) -> None:
        """:meth:`add` for each of ``errors``, in order (so the first one is raised)."""
        for error in errors:
            self.add(error)

    @property
    def paths(self) -> set[str]:
        return {error.path for error in self.found}

    def keep(self, paths: Sequence[str]) -> list[str]:
        """``paths`` less the damaged ones, in order."""
        bad = self.paths
        return [path for path in paths if path not in bad]

    def report(self, shard: Shard, split: str, total: int) -> None:
        """Warns (once) that damaged files of ``split`` were skipped, naming a few."""
        if not self.found:
            return
        names = "; ".join(str(error) for error in self.found[:SHOWN])
        more = f" and {len(self.found) - SHOWN} more" if len(self.found) > SHOWN else ""
        report.warn(shard, f"--skip_corrupt: skipped {len(self.found)} corrupt file(s) of {total} "
                           f"in the {split} split: {names}{more}")
