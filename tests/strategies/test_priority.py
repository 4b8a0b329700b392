"""priority: best fit with GPU headroom kept for priority >= 1."""

from __future__ import annotations

from gpuledger.core.model import Denial, Placement, Reason, Request
from tests.core.core_factory import node
from tests.strategies.support import make


def test_priority_headroom_rule():
    led = make(node("a", 10), priority_headroom=0.2)
    for i in range(8):
        assert isinstance(led.reserve(Request(id=f"low{i}", gpus=1, strategy="priority"), 0.0), Placement)
    d = led.reserve(Request(id="low8", gpus=1, strategy="priority", priority=0), 0.0)
    assert isinstance(d, Denial) and d.by_reason[0][0] == Reason.PRIORITY_HEADROOM
    assert "20%" in d.message
    hi = led.reserve(Request(id="hi", gpus=2, strategy="priority", priority=100), 0.0)
    assert isinstance(hi, Placement)
