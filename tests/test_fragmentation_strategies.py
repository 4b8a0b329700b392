"""`fgd` and `fgd_host` as ledger strategies: decisions through `Ledger.reserve`, on nodes small enough to
compute by hand."""

from __future__ import annotations

import pytest

from allocator.fragmentation import WORKLOAD_KEY, PodShape, TargetWorkload
from allocator.ledger import Ledger, LedgerConfig
from allocator.model import Denial, Device, NodeInfo, Placement, Request
from allocator.strategies import canonical_name, get_strategy


def node(name: str, gpus: int, cpu: int = 64_000, memory: int = 256_000, product: str = "G2") -> NodeInfo:
    return NodeInfo(name, cpu, memory, tuple(Device(i, product=product) for i in range(gpus)), product=product)


def ledger(strategy: str, nodes, workload: TargetWorkload | None = None) -> Ledger:
    led = Ledger(LedgerConfig(default_strategy=strategy))
    if workload is not None:
        led.context_extra[WORKLOAD_KEY] = workload
    for n in nodes:
        led.upsert_node(n)
    return led


def test_registered_under_names_and_aliases():
    assert canonical_name("fgd") == "fgd" and canonical_name("FGD") == "fgd"
    assert canonical_name("fgd-host") == "fgd_host" and canonical_name("fgdHost") == "fgd_host"
    assert get_strategy("fgd").name == "fgd" and get_strategy("fgd_host").name == "fgd_host"


def test_share_goes_to_the_device_that_fragments_least():
    half_half = TargetWorkload(((PodShape(0, 1, 500), 0.5), (PodShape(0, 1, 1000), 0.5)))
    led = ledger("fgd", [node("n", 2)], half_half)
    first = led.reserve(Request("first", gpu_milli=400), 0.0)
    assert isinstance(first, Placement) and first.strategy == "fgd"
    used = first.shares[0].device
    # free is now 600 on `used` and 1000 on the other: a 500 share on 600 lowers fragmentation by 200,
    # on the idle device it raises it by 250 (see test_fragmentation)
    second = led.reserve(Request("second", gpu_milli=500), 0.0)
    assert second.shares[0].device == used


def test_whole_gpu_goes_where_it_removes_fragments():
    two_gpu_pods = TargetWorkload(((PodShape(0, 2, 1000), 1.0),))
    # a: 2 idle GPUs (a 2-GPU pod fits: no fragment); b: 1 idle GPU (a fragment for 2-GPU pods)
    led = ledger("fgd", [node("a", 2), node("b", 1)], two_gpu_pods)
    placement = led.reserve(Request("one", gpus=1), 0.0)
    assert placement.node == "b"  # -1000 there, +1000 on a
    explanation = led.explain(Request("two", gpus=1))
    assert explanation.result.node == "a"  # b is full now
    scores = {s.node: s.score for s in explanation.scores}
    assert scores["a"] == pytest.approx(-1000.0)  # a's last idle GPU becomes a fragment for 2-GPU pods
    assert scores["b"] is None


def test_host_aware_variant_keeps_cpu_pods_off_gpu_nodes_that_need_their_cpu():
    # GPU pods bring 12 cores per GPU; node a has 2 idle GPUs and 30 cores, b has no GPU and 30 cores
    workload = TargetWorkload.from_shapes([PodShape(12_000, 1, 1000)] * 9 + [PodShape(8000, 0, 0)])
    assert workload.cpu_per_gpu_milli == pytest.approx(12.0)
    nodes = [node("a", 2, cpu=30_000), node("b", 0, cpu=30_000)]
    cpu_pod = Request("cpu", cpu_milli=8000)
    # plain FGD sees no change on a (22 cores still fit one 12-core GPU pod): tie, lowest name
    assert ledger("fgd", nodes, workload).reserve(cpu_pod, 0.0).node == "a"
    # fgd_host sees 2000 - 22000/12 = 167 GPU milli that a's CPU could no longer feed
    assert ledger("fgd_host", nodes, workload).reserve(cpu_pod, 0.0).node == "b"


def test_without_a_workload_the_strategy_learns_from_requests_and_is_deterministic():
    def run() -> list[tuple[str, tuple]]:
        led = ledger("fgd", [node("a", 4), node("b", 2), node("c", 8)])
        out = []
        for i in range(12):
            request = Request(f"r{i}", gpus=1) if i % 3 else Request(f"r{i}", gpu_milli=300 + 50 * i)
            placement = led.reserve(request, 0.0)
            assert isinstance(placement, Placement)
            out.append((placement.node, placement.devices or tuple(s.device for s in placement.shares)))
        return out

    assert run() == run()


def test_product_and_resources_are_still_filtered_by_the_ledger():
    workload = TargetWorkload.from_shapes([PodShape(0, 1, 1000)])
    led = ledger("fgd", [node("t4", 2, product="T4"), node("v100", 1, cpu=1000, product="V100M32")], workload)
    assert led.reserve(Request("v", gpus=1, product="V100M32"), 0.0).node == "v100"
    denial = led.reserve(Request("w", gpus=1, product="V100M32", cpu_milli=2000), 0.0)
    assert isinstance(denial, Denial)
    assert led.reserve(Request("x", gpus=2, product="T4"), 0.0).node == "t4"


@pytest.mark.parametrize("strategy", ["fgd", "fgd_host", "best_fit"])
def test_a_gpu_spec_or_list_admits_either_model(strategy):
    workload = TargetWorkload.from_shapes([PodShape(0, 1, 1000)])
    nodes = [node("a-t4", 4, product="T4"), node("b-v100", 1, product="V100M16"), node("c-v100", 2, product="V100M32")]
    led = ledger(strategy, nodes, workload)
    first = led.reserve(Request("one", gpus=1, product="V100M16|V100M32"), 0.0)
    second = led.reserve(Request("two", gpus=2, product="V100M16|V100M32"), 0.0)
    assert {first.node, second.node} == {"b-v100", "c-v100"}
    assert isinstance(led.reserve(Request("three", gpus=1, product="V100M16|V100M32"), 0.0), Denial)


def test_pods_ask_for_them_by_annotation_and_live_admission_learns_the_workload():
    from allocator.pod_request import request_from_pod

    def pod(name: str, strategy: str, gpus: int) -> dict:
        return {"metadata": {"name": name, "annotations": {"agentaflow.gpu/scheduling-strategy": strategy}},
                "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]}}

    led = ledger("best_fit", [node("a", 2), node("b", 1)])  # no workload input: fgd learns from requests
    first = request_from_pod(pod("p1", "fgd-host", 2), None, reservation_id="p1")
    assert first.strategy == "fgd_host"
    assert led.reserve(first, 0.0).node == "a"
    second = request_from_pod(pod("p2", "FGD", 1), None, reservation_id="p2")
    assert second.strategy == "fgd" and led.reserve(second, 0.0).node == "b"
