"""Which part of the data a worker process reads, and where it sits on its node.

A strategy knows the job's layout (:meth:`tfscale.strategies.Strategy.shard`); the input
pipelines read by it (:mod:`input_pipelines.registry`). It lives here, below both, so that the
core never imports the pipelines.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Shard:
    """The part of the data one worker process reads.

    Attributes:
        index: this worker's shard (its global rank), in ``[0, count)``.
        count: number of shards (worker processes).
        local_index: this worker's index on its node, in ``[0, local_count)`` (node-local
            staging splits the copying by it).
        local_count: worker processes on this node.
    """

    index: int = 0
    count: int = 1
    local_index: int = 0
    local_count: int = 1

    def __post_init__(self) -> None:
        if not 0 <= self.index < self.count:
            raise ValueError(f"shard index {self.index} is not in [0, {self.count})")
        if not 0 <= self.local_index < self.local_count:
            raise ValueError(f"local index {self.local_index} is not in [0, {self.local_count})")
