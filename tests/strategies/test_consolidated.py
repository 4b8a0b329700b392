"""consolidated: the fullest leaf, then the fullest node in it (and distributed as its mirror)."""

from __future__ import annotations

from gpuledger.core.model import Request
from tests.core.core_factory import node
from tests.strategies.support import make, take


def test_consolidated_packs_the_fullest_leaf_and_distributed_spreads():
    led = make(
        node("a1", 8, leaf="A"),
        node("a2", 8, leaf="A"),
        node("b1", 8, leaf="B"),
        node("b2", 8, leaf="B"),
    )
    take(led, "a1", 4, "pre")
    c = led.reserve(Request(id="c", gpus=1, strategy="consolidated"), 0.0)
    assert c.node == "a1"  # leaf A has less free; a1 is the fullest node in it
    d = led.reserve(Request(id="d", gpus=1, strategy="distributed"), 0.0)
    assert d.node in ("b1", "b2") and d.node == "b1"  # emptiest leaf, emptiest node, ties by name
