"""least_utilized: the node with the most free capacity."""

from __future__ import annotations

from gpuledger.core.model import Request
from tests.core.core_factory import node
from tests.strategies.support import make, take


def test_least_utilized_shares_go_to_emptiest_node():
    led = make(node("a", 2), node("b", 2))
    take(led, "a", 1, "pre")
    p = led.reserve(Request(id="s", gpu_milli=500, strategy="least_utilized"), 0.0)
    assert p.node == "b"


# --- published utilization (the node agent's agentaflow.gpu/devices "utilization" + last-update) ------------

NOW = 1_735_689_600.0  # 2025-01-01T00:00:00Z, the stamp below


def agent_node(name, utilization, stamp="2025-01-01T00:00:00Z", gpus=4):
    from tests.core.core_factory import node

    obj = node(
        name,
        gpus,
        devices=[
            {"index": i, "uuid": f"{name}-{i}", "utilization": u}
            for i, u in zip(range(gpus), utilization, strict=True)
        ],
    )
    if stamp:
        obj["metadata"]["annotations"]["agentaflow.gpu/last-update"] = stamp
    return obj


def test_node_parsing_keeps_utilization_and_its_time():
    from gpuledger.core.pods.objects import node_from_object

    info = node_from_object(agent_node("a", [5, 90, 0, 100]))
    assert [d.utilization_pct for d in info.devices] == [5, 90, 0, 100]
    assert info.utilization_at == NOW
    bad = node_from_object(agent_node("b", ["x", 101, -1, True], stamp="yesterday"))
    assert [d.utilization_pct for d in bad.devices] == [None] * 4 and bad.utilization_at is None


def test_fresh_utilization_beats_free_capacity_and_picks_the_idlest_gpus():
    led = make(agent_node("busy", [80, 80, 80, 80]), agent_node("idle", [10, 0, 30, 20]))
    take(led, "idle", 1, "pre")  # idle has fewer free GPUs, but they are the less utilized
    p = led.reserve(Request(id="r", gpus=2, strategy="least_utilized"), NOW + 10)
    assert p.node == "idle" and p.devices == (1, 3)  # device 0 is taken; 1 (0%) and 3 (20%)


def test_allocation_breaks_ties_between_equally_utilized_nodes():
    led = make(agent_node("a", [50] * 4), agent_node("b", [50] * 4))
    take(led, "a", 1, "pre")
    p = led.reserve(Request(id="r", gpus=1, strategy="least_utilized"), NOW)
    assert p.node == "b"


def test_stale_utilization_falls_back_to_allocation():
    led = make(agent_node("busy", [90] * 4), agent_node("idle", [0] * 4))
    take(led, "idle", 2, "pre")
    # no time given yet (the set-up ran at 0, far from the report): stale, so the emptier node
    assert (
        led.explain(Request(id="e", gpus=1, strategy="least_utilized"), with_scores=False).result.node
        == "busy"
    )
    # fresh: idle's free GPUs are idle, so idle wins though it has fewer free
    assert led.reserve(Request(id="f", gpus=1, strategy="least_utilized"), NOW + 60).node == "idle"
    led.release("f")
    # past the staleness (120 s by default): allocation alone, so the emptier node
    p = led.reserve(Request(id="s", gpus=1, strategy="least_utilized"), NOW + 121)
    assert p.node == "busy"
    led.config.utilization_max_age_s = 600.0  # configurable
    led.release("s")
    assert led.reserve(Request(id="t", gpus=1, strategy="least_utilized"), NOW + 122).node == "idle"


def test_shares_go_to_the_least_utilized_gpu_when_fresh():
    led = make(agent_node("a", [70, 10, 40, 90]))
    p = led.reserve(Request(id="s", gpu_milli=300, strategy="least_utilized"), NOW)
    assert p.shares[0].device == 1
