"""round_robin: the next node by name after the previous placement, wrapping."""

from __future__ import annotations

from allocator.core.model import Request
from tests.core.core_factory import node
from tests.strategies.support import make, take


def test_round_robin_rotates_deterministically():
    led = make(node("a", 8), node("b", 8), node("c", 8))
    got = [led.reserve(Request(id=f"r{i}", gpus=1, strategy="round_robin"), 0.0).node for i in range(5)]
    assert got == ["a", "b", "c", "a", "b"]
    # a node that cannot fit is skipped, the rotation continues after the node used
    take(led, "c", 7, "fill-c")
    assert led.reserve(Request(id="r5", gpus=1, strategy="round_robin"), 0.0).node == "a"
