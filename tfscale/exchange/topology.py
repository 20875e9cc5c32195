"""The layout of a job's processes on its nodes: which ranks share a node, and the local index
of each (the node exchange runs among a node's ranks; the cross-node exchange among the ranks
of one local index)."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Topology:
    """Processes grouped into nodes of equal size.

    Attributes:
        nodes: each node's global ranks, in local-index order.
        rank: this process's global rank.
    """

    nodes: tuple[tuple[int, ...], ...]
    rank: int

    def __post_init__(self) -> None:
        sizes = {len(node) for node in self.nodes}
        if len(sizes) != 1 or 0 in sizes:
            raise ValueError(
                f"ranks do not form nodes of equal size ({self._layout()}); hierarchical "
                "all-reduce needs the same number of processes on every node: fix the host "
                "list or regroup the ranks with --ddl_local_size")
        ranks = sorted(r for node in self.nodes for r in node)
        if ranks != list(range(len(ranks))) or self.rank not in ranks:
            raise ValueError(f"nodes {self._layout()} do not hold each of ranks 0..{len(ranks) - 1}"
                             f" exactly once (with this process's rank {self.rank})")

    def _layout(self) -> str:
        return ", ".join(f"node {i}: ranks {list(node)}" for i, node in enumerate(self.nodes))

    @classmethod
    def from_placement(cls, placement: Sequence[tuple[int, int]], rank: int) -> Topology:
        """The topology where rank ``r`` is local index ``placement[r][1]`` of node
        ``placement[r][0]`` (Horovod's cross rank and local rank under a uniform layout).

        Raises:
            ValueError: if the placement does not form equal nodes with local indices
                ``0..L-1`` each used once per node.
        """
        by_node: dict[int, dict[int, int]] = {}
        for r, (node, local) in enumerate(placement):
            if local in by_node.setdefault(node, {}):
                raise ValueError(f"ranks {by_node[node][local]} and {r} both claim local index "
                                 f"{local} on node {node}; the launcher's layout is inconsistent")
            by_node[node][local] = r
        nodes = []
        for node in sorted(by_node):
            locals_ = by_node[node]
            if sorted(locals_) != list(range(len(locals_))):
                raise ValueError(f"node {node} has local indices {sorted(locals_)}; expected "
                                 f"0..{len(locals_) - 1}")
            nodes.append(tuple(locals_[j] for j in range(len(locals_))))
        return cls(tuple(nodes), rank)

    @classmethod
    def regular(cls, size: int, local_size: int, rank: int) -> Topology:
        """``size`` ranks in nodes of ``local_size``: rank ``r`` on node ``r // local_size``.

        Raises:
            ValueError: if ``local_size`` does not divide ``size``.
        """
        if local_size < 1 or size % local_size:
            raise ValueError(f"--ddl_local_size={local_size} does not divide the job's {size} "
                             f"processes into equal nodes; choose a divisor of {size}")
        return cls(tuple(tuple(range(s, s + local_size)) for s in range(0, size, local_size)),
                   rank)

    @property
    def size(self) -> int:
        return sum(len(node) for node in self.nodes)

    @property
    def local_size(self) -> int:
        """Processes per node."""
        return len(self.nodes[0])

    @property
    def num_nodes(self) -> int:
        return len(self.nodes)

    @property
    def node_index(self) -> int:
        return next(i for i, node in enumerate(self.nodes) if self.rank in node)

    @property
    def local_index(self) -> int:
        return self.nodes[self.node_index].index(self.rank)

    @property
    def node_ranks(self) -> tuple[int, ...]:
        """The ranks on this process's node (phases 1 and 3)."""
        return self.nodes[self.node_index]

    @property
    def cross_ranks(self) -> tuple[int, ...]:
        """The ranks with this process's local index, one per node (phase 2)."""
        return tuple(node[self.local_index] for node in self.nodes)

    def describe(self) -> str:
        return f"{self.num_nodes} node(s) x {self.local_size} process(es)"
