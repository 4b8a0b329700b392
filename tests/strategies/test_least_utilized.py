"""least_utilized: the node with the most free capacity."""

from __future__ import annotations

from allocator.core.model import Request
from tests.core.core_factory import node
from tests.strategies.support import make, take


def test_least_utilized_shares_go_to_emptiest_node():
    led = make(node("a", 2), node("b", 2))
    take(led, "a", 1, "pre")
    p = led.reserve(Request(id="s", gpu_milli=500, strategy="least_utilized"), 0.0)
    assert p.node == "b"
