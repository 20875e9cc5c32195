"""bench.grpc_ring_training's arithmetic: the step time a 2x2 gRPC ring adds over its one-node
baseline, per byte that one core's ranks put through the network stack."""

from __future__ import annotations

import pytest

from bench import grpc_ring_training
from bench.common import gradient_bytes


def test_the_ring_adds_its_step_over_the_nodes_per_stack_byte() -> None:
    # mlp, 64 images per rank: the 2x2 ring trains 256 images a step, a node 128. Each of a
    # node's two ranks sends 2 x 3/4 of the gradients through the stack (in-node hops too).
    ring, nodes = 2431.663, [3942.977, 3764.148]
    added = 256 / ring - 128 / ((nodes[0] + nodes[1]) / 2)
    stack = 2 * 1.5 * gradient_bytes("mlp")
    ns = grpc_ring_training.ns_per_stack_byte("mlp", ring, nodes, 64)
    assert ns == pytest.approx(added / stack * 1e9)
    assert ns == pytest.approx(2.556, abs=0.001)  # the Zen 3 loopback run of 2026-12-04
    # Two nodes' worth of images/s, the ring's step is the node's: nothing added.
    assert grpc_ring_training.ns_per_stack_byte("mlp", 6000.0, [3000.0, 3000.0], 64) == 0.0


def test_a_rate_that_is_not_positive_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="images/s must be positive: ring 0.0"):
        grpc_ring_training.ns_per_stack_byte("mlp", 0.0, [3000.0, 3000.0], 64)
