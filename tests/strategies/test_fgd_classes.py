"""fgd and fgd_host's class walk (nodes grouped by kind and free state) decide exactly as scoring every node:
random clusters of a few node kinds, requests of every kind, releases, cordons, health changes and removals.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuledger.core.model import Device, GroupSpec, NodeInfo, Placement, Request
from gpuledger.core.plugins.plugin import ScoreContext
from gpuledger.strategies import register
from gpuledger.strategies.fgd import FragmentationGradientDescent
from gpuledger.strategies.fgd_host import HostAwareFGD
from gpuledger.strategies.fragmentation import PodShape, TargetWorkload
from tests.strategies.support import ledger, node_info


class _FullScanFGD(FragmentationGradientDescent):
    """fgd with its walk switched off: the ledger filters and scores every node."""

    name = "fgd_full_scan"

    def candidates(self, request, ctx, leaves):
        return None


class _FullScanHost(HostAwareFGD):
    name = "fgd_host_full_scan"

    def candidates(self, request, ctx, leaves):
        return None


register("fgd_full_scan", _FullScanFGD)
register("fgd_host_full_scan", _FullScanHost)

KINDS = [("T4", 2, 104_000), ("G2", 8, 96_000), ("V100M32", 8, 64_000), ("P100", 4, 32_000)]


def make_nodes(rng: random.Random, count: int) -> list[NodeInfo]:
    nodes = []
    for i in range(count):
        product, gpus, cpu = rng.choice(KINDS)
        devices = tuple(Device(d, product=product, memory_mib=16_000) for d in range(gpus))
        nodes.append(NodeInfo(f"n{i:02d}", cpu, 256_000, devices, product=product))
    return nodes


def make_request(rng: random.Random, i: int) -> Request:
    kind = rng.random()
    cpu = rng.choice([0, 2000, 8000, 12_000, 32_000])
    product = rng.choice([None, None, None, "G2", "T4", "V100M32|P100"])
    if kind < 0.4:
        return Request(f"r{i}", gpus=rng.choice([1, 1, 1, 2, 4, 8]), cpu_milli=cpu, product=product)
    if kind < 0.75:
        return Request(
            f"r{i}", gpu_milli=rng.choice([110, 250, 460, 500, 810]), cpu_milli=cpu, product=product
        )
    if kind < 0.82:
        return Request(f"r{i}", gpu_memory_mib=rng.choice([2000, 8000]), cpu_milli=cpu)
    return Request(f"r{i}", cpu_milli=cpu or 4000, memory_mib=rng.choice([0, 65_536]))


def decisions(strategy: str, nodes, requests, seed: int, workload) -> list:
    """Each request's placement, with releases and node changes drawn from `seed` between them."""
    rng = random.Random(seed)
    led = ledger(strategy, nodes, workload)
    out, held = [], []
    for request in requests:
        event = rng.random()
        if held and event < 0.2:
            led.release(held.pop(rng.randrange(len(held))))
        elif event < 0.25:  # cordon / uncordon, a GPU failing or coming back, a node leaving and returning
            node = rng.choice(nodes)
            change = rng.random()
            if change < 0.4:
                led.upsert_node(
                    NodeInfo(
                        node.name,
                        node.cpu_milli,
                        node.memory_mib,
                        node.devices,
                        product=node.product,
                        unschedulable=rng.random() < 0.5,
                    )
                )
            elif change < 0.8 and node.devices:
                sick = rng.randrange(len(node.devices))
                devices = tuple(
                    Device(
                        d.index,
                        product=d.product,
                        memory_mib=d.memory_mib,
                        healthy=d.index != sick or rng.random() < 0.5,
                    )
                    for d in node.devices
                )
                led.upsert_node(
                    NodeInfo(node.name, node.cpu_milli, node.memory_mib, devices, product=node.product)
                )
            else:
                led.remove_node(node.name)
                led.upsert_node(node)
        result = led.reserve(request, 0.0)
        if isinstance(result, Placement):
            held.append(request.id)
            out.append((result.node, result.devices, tuple((s.device, s.milli) for s in result.shares)))
        else:
            out.append(None)
    return out


@pytest.mark.parametrize("strategy", ["fgd", "fgd_host"])
@pytest.mark.parametrize("learnt", [False, True])
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), count=st.integers(1, 24))
def test_class_walk_decides_exactly_as_the_full_scan(strategy, learnt, seed, count):
    rng = random.Random(seed)
    nodes = make_nodes(rng, count)
    requests = [make_request(rng, i) for i in range(3 * count + 20)]
    workload = None if learnt else TargetWorkload.from_requests(requests)
    fast = decisions(strategy, nodes, requests, seed, workload)
    full = decisions(f"{strategy}_full_scan", nodes, requests, seed, workload)
    assert fast == full


@pytest.mark.parametrize("seed", range(4))
def test_walk_order_is_the_per_node_scan_order(seed):
    """Not only the first node: the whole order the class walk yields is the per-node walk's."""
    rng = random.Random(seed)
    nodes = make_nodes(rng, 30)
    requests = [make_request(rng, i) for i in range(80)]
    workload = TargetWorkload.from_requests(requests)
    led = ledger("fgd_host", nodes, workload)
    strategy = HostAwareFGD()
    for request in requests:
        ctx = ScoreContext(index=led.index, extra=led.context_extra)
        by_class = [n.name for n in strategy.candidates(request, ctx, None)]
        by_node = [n.name for n in strategy.scan_candidates(request, ctx, None)]
        assert by_class == by_node
        led.reserve(request, 0.0)


def test_identical_nodes_share_one_class():
    nodes = [
        NodeInfo(f"n{i}", 64_000, 256_000, tuple(Device(d, product="G2") for d in range(8)), product="G2")
        for i in range(50)
    ]
    led = ledger("fgd_host", nodes, TargetWorkload.from_requests([Request("a", gpus=1)]))
    for i in range(3):
        assert led.reserve(Request(f"p{i}", gpus=1), 0.0).node == "n0"
    strategy = led_strategy("fgd_host")
    classes = strategy._classes[led.index]
    assert sorted(len(names) for names in classes.members.values()) == [1, 49]


def led_strategy(name: str):
    from gpuledger.core.plugins import registry

    return registry.get_strategy(name)


@pytest.mark.parametrize("seed", range(6))
def test_fgd_denials_from_the_kept_diagnosis_equal_the_full_walk(seed):
    """fgd refuses a node exactly when the default device choice does, so the ledger answers its denials from
    the per-shape diagnosis (O(changes)); the answer is the full walk's, with the fgd strategy itself."""
    from gpuledger.core.plugins import registry

    rng = random.Random(seed)
    nodes = make_nodes(rng, 12)
    requests = [make_request(rng, i) for i in range(120)]
    led = ledger("fgd_host", nodes, TargetWorkload.from_requests(requests))
    strategy = registry.get_strategy("fgd_host")
    denials = 0
    for request in requests:
        ctx = led._filters.context(request)
        kept = led._diagnoser.diagnose(request, strategy, ctx)
        full = led._diagnoser.diagnose_full(request, strategy, ctx)
        assert kept == full
        denials += isinstance(led.reserve(request, 0.0), Placement) is False
    assert denials > 10


@pytest.mark.parametrize("strategy", ["fgd", "fgd_host"])
def test_a_gang_on_one_node_gets_distinct_devices(strategy):
    # the gang planner probes a node by holding the first pod's devices on the node itself (no index change):
    # each next pod must see them taken, not be answered from the first pod's evaluation
    nodes = [node_info("n0", 8, cpu=96_000), node_info("n1", 8, cpu=96_000)]
    led = ledger(strategy, nodes, TargetWorkload.from_shapes([PodShape(8000, 4, 1000)]))
    first = led.reserve(Request("g0", gpus=4, group=GroupSpec("job/ml/g", 4), seed=1), 0.0)
    assert isinstance(first, Placement), first
    held = [(s.node, d) for s in first.group_plan for d in s.devices]
    assert len(held) == len(set(held)) == 16


def test_per_model_totals_survive_nodes_that_hold_nothing_free():
    # a full node holds (model, 0); when the model's last free milli leaves, its total goes, and the full node
    # must still be able to move later
    from gpuledger.strategies.fgd_classes import _move

    totals: dict[str, int] = {}
    held: dict[str, tuple[str, int]] = {}
    _move(totals, held, "full", ("T4", 0))
    _move(totals, held, "other", ("T4", 500))
    _move(totals, held, "other", None)  # cordoned or removed
    assert totals == {}
    _move(totals, held, "full", ("T4", 300))  # a release on the full node
    assert totals == {"T4": 300} and held == {"full": ("T4", 300)}
