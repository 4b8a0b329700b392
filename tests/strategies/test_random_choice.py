"""random: a node that depends only on (seed, request id)."""

from __future__ import annotations

from gpuledger.core.model import Request
from tests.core.core_factory import node
from tests.strategies.support import make


def test_random_is_seeded_by_seed_and_id():
    nodes = [node(f"n{i}", 8) for i in range(20)]

    def pick(seed, rid):
        return make(*nodes).reserve(Request(id=rid, gpus=1, strategy="random", seed=seed), 0.0).node

    assert pick(1, "x") == pick(1, "x")
    picks = {pick(s, f"id{s}") for s in range(12)}
    assert len(picks) > 3
