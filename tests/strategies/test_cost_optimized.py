"""cost_optimized: cheap nodes first, best fit among equals."""

from __future__ import annotations

from gpuledger.core.model import Request
from tests.core.core_factory import node
from tests.strategies.support import make, take


def test_cost_optimized_prefers_cheap_nodes():
    cheap = {"gpu-orchestrator/cheap-node": "true"}
    led = make(node("a", 8), node("b", 8, labels=cheap), node("c", 2))
    assert led.reserve(Request(id="1", gpus=2, strategy="cost_optimized"), 0.0).node == "b"
    take(led, "b", 6, "fill")
    assert led.reserve(Request(id="2", gpus=2, strategy="costOptimized"), 0.0).node == "c"
