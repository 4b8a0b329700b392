"""The registry wiring: every built-in strategy under its name and aliases, a clear error for an unknown name,
and a plug-in strategy registered at run time.
"""

from __future__ import annotations

import pytest

from gpuledger import strategies
from gpuledger.core.model import Request
from gpuledger.strategies import canonical_name, get_strategy
from tests.core.core_factory import node
from tests.strategies.support import make


def test_registry_names_and_aliases():
    names = strategies.strategy_names()
    for name in (
        "best_fit",
        "least_utilized",
        "round_robin",
        "priority",
        "random",
        "cost_optimized",
        "consolidated",
        "distributed",
        "balanced",
        "explicit",
    ):
        assert name in names
    assert strategies.get_strategy("leastLoaded").name == "least_utilized"
    assert strategies.get_strategy("least_loaded").name == "least_utilized"
    assert strategies.get_strategy("Least-Utilized").name == "least_utilized"
    assert strategies.get_strategy("roundRobin").name == "round_robin"
    assert strategies.get_strategy("costOptimized").name == "cost_optimized"
    assert strategies.get_strategy("bestFit").name == "best_fit"


def test_unknown_strategy_raises_value_error_listing_names():
    with pytest.raises(ValueError) as err:
        strategies.get_strategy("teleport")
    message = str(err.value)
    assert "'teleport'" in message
    for name in ("best_fit", "least_utilized", "balanced", "consolidated"):
        assert name in message


def test_register_plugin_strategy():
    class LastByName(strategies.Strategy):
        name = "test_last_by_name"

        def score(self, node, request, fit, ctx):
            return float(int(node.name[1:]))

    strategies.register("test_last_by_name", LastByName, aliases=("testLastByName",))
    led = make(node("n1", 2), node("n3", 2), node("n2", 2))
    p = led.reserve(Request(id="x", gpus=1, strategy="testLastByName"), 0.0)
    assert p.node == "n3" and p.strategy == "test_last_by_name"


def test_registered_under_names_and_aliases():
    assert canonical_name("fgd") == "fgd" and canonical_name("FGD") == "fgd"
    assert canonical_name("fgd-host") == "fgd_host" and canonical_name("fgdHost") == "fgd_host"
    assert get_strategy("fgd").name == "fgd" and get_strategy("fgd_host").name == "fgd_host"
