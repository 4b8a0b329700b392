"""distributed: the emptiest leaf, then the emptiest node in it; the walk's tied-group fast start."""

from __future__ import annotations

from gpuledger.core.model import Request
from tests.core.core_factory import node
from tests.strategies.support import make


def test_distributed_takes_the_next_node_when_the_first_of_a_tied_group_is_refused():
    led = make(
        node("a1", 4, leaf="la", taints=[{"key": "dedicated", "effect": "NoSchedule"}]),
        node("b1", 4, leaf="lb"),
        node("b2", 2, leaf="lb"),
        node("c1", 2, leaf="lc"),
        node("c2", 4, leaf="lc"),
    )
    # leaf totals: la 4, lb 6, lc 6 (tied); most free first: b1 (4), c2 (4) -> b1
    p = led.reserve(Request(id="r1", gpus=1, strategy="distributed"), 0.0)
    assert p.node == "b1"
    # now lc 6 leads alone: c2
    assert led.reserve(Request(id="r2", gpus=1, strategy="distributed"), 0.0).node == "c2"
    # totals lb 5, lc 5 tied: b1 3, c2 3 -> b1 by name; a request b1 cannot take (cpu) goes to c2 next
    led.apply_object(node("b1", 4, leaf="lb", cpu="1"), 0.0)
    p = led.reserve(Request(id="r3", gpus=1, cpu_milli=2000, strategy="distributed"), 0.0)
    assert p.node == "c2"
