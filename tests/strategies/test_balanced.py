"""balanced: a weighted sum whose weights and history are inputs."""

from __future__ import annotations

import pytest

from gpuledger.core.model import Request
from tests.core.core_factory import node
from tests.strategies.support import make, take


def test_balanced_weights_are_configurable():
    led = make(node("a", 8, leaf="A"), node("b", 8, leaf="B"))
    take(led, "a", 4, "pre")
    # availability favours the empty node b
    assert led.reserve(Request(id="1", gpus=1, strategy="balanced"), 0.0).node == "b"
    only_history = {
        "resourceAvailability": 0,
        "topologyAlignment": 0,
        "domainUtilization": 0,
        "historicalPerformance": 1,
    }
    led2 = make(node("a", 8), node("b", 8), balanced_weights=only_history)
    led2.performance.update({"a": 0.9, "b": 0.2})
    assert led2.reserve(Request(id="1", gpus=1, strategy="balanced"), 0.0).node == "a"
    ex = led2.explain(Request(id="2", gpus=1, strategy="balanced"))
    assert [s.node for s in ex.scores] == ["a", "b"] and ex.scores[0].score == pytest.approx(0.9)
