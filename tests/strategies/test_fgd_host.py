"""fgd_host: FGD plus the GPUs a node's CPU and memory could no longer feed."""

from __future__ import annotations

import pytest

from gpuledger.core.model import NodeInfo, Request
from gpuledger.strategies import register
from gpuledger.strategies.fgd_host import HostAwareFGD
from gpuledger.strategies.fragmentation import PodShape, TargetWorkload
from tests.strategies.support import ledger, node_info


def test_host_aware_variant_keeps_cpu_pods_off_gpu_nodes_that_need_their_cpu():
    # GPU pods bring 12 cores per GPU; node a has 2 idle GPUs and 30 cores, b has no GPU and 30 cores
    workload = TargetWorkload.from_shapes([PodShape(12_000, 1, 1000)] * 9 + [PodShape(8000, 0, 0)])
    assert workload.cpu_per_gpu_milli == pytest.approx(12.0)
    nodes = [node_info("a", 2, cpu=30_000), node_info("b", 0, cpu=30_000)]
    cpu_pod = Request("cpu", cpu_milli=8000)
    # plain FGD sees no change on a (22 cores still fit one 12-core GPU pod): tie, lowest name
    assert ledger("fgd", nodes, workload).reserve(cpu_pod, 0.0).node == "a"
    # fgd_host sees 2000 - 22000/12 = 167 GPU milli that a's CPU could no longer feed
    assert ledger("fgd_host", nodes, workload).reserve(cpu_pod, 0.0).node == "b"


def test_model_pressure_is_pinned_demand_share_over_capacity_share():
    from gpuledger.strategies.fgd_host import model_pressure

    pinned_to_v100 = PodShape(0, 1, 1000, ("V100",))
    free = PodShape(0, 1, 1000)
    workload = TargetWorkload.from_shapes([pinned_to_v100] * 3 + [free] * 7)
    # V100: 30% of the demand is pinned to it, it has 10% of the capacity -> 3.0; T4: nothing pinned -> 0
    assert model_pressure(workload, {"V100": 1000, "T4": 9000}) == {"V100": pytest.approx(3.0), "T4": 0.0}
    assert model_pressure(TargetWorkload.from_shapes([free]), {"V100": 1000, "T4": 9000}) == {}
    either = PodShape(0, 1, 1000, ("V100", "T4"))  # an OR-list counts evenly on each model it allows
    split = model_pressure(TargetWorkload.from_shapes([either]), {"V100": 5000, "T4": 5000})
    assert split == {"V100": pytest.approx(1.0), "T4": pytest.approx(1.0)}


def test_unpinned_pods_leave_the_model_pinned_pods_need():
    # a quarter of the pods pinned to each model: FGD's fragments are alike on both nodes and the lowest name
    # wins, the V100 node; but V100 is a third of the capacity for half the pinned demand (pressure 0.75
    # against T4's 0.375), so fgd_host sends the unpinned pod to the T4 node
    v100, t4, free = PodShape(0, 1, 1000, ("V100",)), PodShape(0, 1, 1000, ("T4",)), PodShape(0, 1, 1000)
    workload = TargetWorkload.from_shapes([v100, t4, free, free])
    nodes = [node_info("a-v100", 2, product="V100"), node_info("b-t4", 4, product="T4")]
    assert ledger("fgd", nodes, workload).reserve(Request("free", gpus=1), 0.0).node == "a-v100"
    led = ledger("fgd_host", nodes, workload)
    assert led.reserve(Request("free", gpus=1), 0.0).node == "b-t4"
    assert led.reserve(Request("pinned", gpus=1, product="V100"), 0.0).node == "a-v100"
    # capacity follows the nodes: with the T4 node cordoned, the V100 node is all there is
    cordoned = NodeInfo("b-t4", 64_000, 256_000, nodes[1].devices, product="T4", unschedulable=True)
    led.upsert_node(cordoned)
    assert led.reserve(Request("free2", gpus=1), 0.0).node == "a-v100"


class _StaticModelTerm(HostAwareFGD):
    """fgd_host with its model term against the whole capacity per model (the earlier, static form)."""

    name = "fgd_host_static_models"
    model_basis = "capacity"


register("fgd_host_static_models", _StaticModelTerm)


def test_the_model_term_follows_free_capacity_not_only_capacity():
    # pinned demand follows capacity (a quarter of the pods pinned to each of two equal nodes): the pressures
    # start equal, so the first unpinned pod goes by name to the V100 node; once two V100-pinned pods have
    # filled it to one free GPU, V100 holds a fifth of the free milli for half the pinned demand (pressure
    # 0.25 x 5 = 1.25 against T4's 0.25 x 5/4), and the next unpinned pod keeps that GPU for them
    v100, t4, free = PodShape(0, 1, 1000, ("V100",)), PodShape(0, 1, 1000, ("T4",)), PodShape(0, 1, 1000)
    workload = TargetWorkload.from_shapes([v100, t4, free, free])
    nodes = [node_info("a-v100", 4, product="V100"), node_info("b-t4", 4, product="T4")]
    placed = {}
    for strategy in ("fgd_host", "fgd_host_static_models"):
        led = ledger(strategy, nodes, workload)
        assert led.reserve(Request("free1", gpus=1), 0.0).node == "a-v100"
        for i in range(2):
            assert led.reserve(Request(f"v{i}", gpus=1, product="V100"), 0.0).node == "a-v100"
        placed[strategy] = led.reserve(Request("free2", gpus=1), 0.0).node
    assert placed == {"fgd_host": "b-t4", "fgd_host_static_models": "a-v100"}


def test_model_offsets_are_empty_without_pinned_demand():
    # every workload without pins places exactly as the host term alone: no offset is ever added
    from gpuledger.strategies.fgd_classes import StateClasses
    from gpuledger.strategies.fragmentation import FragmentationMeter

    led = ledger(
        "fgd_host", [node_info("a", 2, product="T4")], TargetWorkload.from_shapes([PodShape(0, 1, 1000)])
    )
    meter = FragmentationMeter(TargetWorkload.from_shapes([PodShape(0, 1, 1000)]))
    classes = StateClasses(led.index)
    classes.sync(lambda node: (node.name,))
    assert classes.free == {"T4": 2000} and classes.capacity == {"T4": 2000}
    assert HostAwareFGD().model_offsets(Request("r", gpus=1), meter, classes) == {}
