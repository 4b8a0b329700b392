"""Ledger operations: reserve/confirm/release/expire/get, shares, cluster objects, rebuild."""

from __future__ import annotations

import pytest

from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Denial, Placement, Reason, Request, ReservationState
from gpuledger.core.pods import placement_codec
from tests.core.core_factory import node, pod

KEY = b"test-key"


def ledger_with(*nodes, **config) -> Ledger:
    led = Ledger(LedgerConfig(placement_key=KEY, **config))
    for n in nodes:
        led.apply_object(n, 0.0)
    return led


def test_whole_gpus_best_fit_picks_fullest_node_and_lowest_devices():
    led = ledger_with(node("a", 8), node("b", 4), node("c", 2))
    p = led.reserve(Request(id="r1", gpus=2), 0.0)
    assert isinstance(p, Placement)
    assert (p.node, p.devices, p.strategy) == ("c", (0, 1), "best_fit")
    p2 = led.reserve(Request(id="r2", gpus=3), 0.0)
    assert (p2.node, p2.devices) == ("b", (0, 1, 2))
    assert led.get("r1") == p and led.get("nope") is None


def test_reserve_is_idempotent_per_id():
    led = ledger_with(node("a", 8))
    p = led.reserve(Request(id="r", gpus=2), 0.0)
    assert led.reserve(Request(id="r", gpus=2), 5.0) == p
    assert led.index.nodes["a"].whole_free == 6


def test_release_restores_and_is_idempotent_and_safe_without_reserve():
    led = ledger_with(node("a", 4))
    before = led.snapshot()
    led.reserve(Request(id="r", gpus=3, cpu_milli=500, memory_mib=100), 0.0)
    assert led.release("r") is True
    assert led.release("r") is False
    assert led.release("never") is False
    assert led.snapshot() == before


def test_shares_best_fit_device_and_capacity():
    led = ledger_with(node("a", 2, gpu_memory=1000))
    p1 = led.reserve(Request(id="s1", gpu_milli=600, gpu_memory_mib=500), 0.0)
    p2 = led.reserve(Request(id="s2", gpu_milli=400, gpu_memory_mib=500), 0.0)
    assert p1.shares[0].device == 0 and p2.shares[0].device == 0  # fills the used device first
    p3 = led.reserve(Request(id="s3", gpu_milli=100), 0.0)
    assert p3.shares[0].device == 1
    d = led.reserve(Request(id="w", gpus=2), 0.0)
    assert isinstance(d, Denial) and d.by_reason[0][0] == Reason.NOT_ENOUGH_GPUS
    n = led.index.nodes["a"]
    assert n.dev_free_milli == [0, 900] and n.dev_free_mem == [0, 1000]


def test_share_memory_limits():
    led = ledger_with(node("a", 1, gpu_memory=1000))
    assert isinstance(led.reserve(Request(id="m1", gpu_milli=100, gpu_memory_mib=800), 0.0), Placement)
    d = led.reserve(Request(id="m2", gpu_milli=100, gpu_memory_mib=300), 0.0)
    assert isinstance(d, Denial) and d.by_reason == ((Reason.NOT_ENOUGH_GPU_SHARE, 1),)


def test_confirm_and_expire():
    led = ledger_with(node("a", 8), reservation_ttl_s=30)
    led.reserve(Request(id="r1", gpus=1), 0.0)
    led.reserve(Request(id="r2", gpus=1), 10.0)
    assert led.confirm("r1", 5.0) is True and led.confirm("zz", 5.0) is False
    assert led.expiry_candidates(35.0) == []
    assert led.expiry_candidates(40.0) == ["r2"]
    assert led.expire(40.0) == ["r2"]
    assert led.get("r2") is None and led.state_of("r1") == ReservationState.CONFIRMED
    assert led.expire(1000.0) == []


def test_unknown_strategy_is_a_clear_denial():
    led = ledger_with(node("a", 8))
    d = led.reserve(Request(id="r", gpus=1, strategy="fastest"), 0.0)
    assert isinstance(d, Denial)
    assert "fastest" in d.message and "best_fit" in d.message and "least_utilized" in d.message


def test_pod_objects_confirm_count_and_release():
    led = ledger_with(node("a", 8))
    p = led.reserve(Request(id="r", gpus=2, cpu_milli=1000), 0.0)
    led.apply_object(pod("p1", placement=p, key=KEY, cpu="1"), 1.0)
    assert led.state_of("r") == ReservationState.CONFIRMED
    led.apply_object(pod("foreign", node_name="a", gpus=3, cpu="2"), 1.0)
    n = led.index.nodes["a"]
    assert n.whole_free == 3 and n.cpu_free == 64000 - 3000
    led.apply_object(pod("p1", placement=p, key=KEY, phase="Succeeded"), 2.0)
    assert led.get("r") is None and n.whole_free == 5
    led.delete_object(pod("foreign", node_name="a", gpus=3))
    assert n.whole_free == 8 and n.cpu_free == 64000


def test_bad_signature_counts_as_unknown_gpus():
    led = ledger_with(node("a", 8))
    p = Placement(id="x", node="a", devices=(0, 1))
    led.apply_object(pod("p", placement=p, key=b"wrong-key", gpus=2), 0.0)
    assert led.get("x") is None
    assert led.index.nodes["a"].unknown_gpus == 2 and led.index.nodes["a"].whole_free == 6
    assert any("placement" in msg for msg in led.problems)


def test_rebuild_equals_live():
    nodes = [node("a", 8), node("b", 4)]
    led = ledger_with(*nodes)
    pods = []
    for i, req in enumerate(
        [Request(id="r1", gpus=2), Request(id="r2", gpu_milli=300), Request(id="r3", gpus=4)]
    ):
        p = led.reserve(req, 0.0)
        pods.append(pod(f"p{i}", placement=p, key=KEY))
    pods.append(pod("other", node_name="a", gpus=1, cpu="1", memory="1Gi"))
    for o in pods:
        led.apply_object(o, 1.0)
    rebuilt = Ledger.rebuild({"kind": "List", "items": nodes + pods}, led.config, now=1.0)
    assert rebuilt.snapshot() == led.snapshot()


def test_explain_reserves_nothing():
    led = ledger_with(node("a", 8), node("b", 2, taints=[{"key": "x", "effect": "NoSchedule"}]))
    before = led.snapshot()
    ex = led.explain(Request(id="r", gpus=1))
    assert isinstance(ex.result, Placement) and ex.result.node == "a"
    assert {s.node: s.reasons for s in ex.scores}["b"] == (Reason.TAINT,)
    assert led.snapshot() == before


@pytest.mark.parametrize("text", ["", "{}", "[]", "not json", '{"id": 1, "node": "a"}'])
def test_decode_placement_rejects_garbage(text):
    assert placement_codec.decode_placement(text, KEY) is None
