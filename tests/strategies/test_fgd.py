"""fgd as a ledger strategy: decisions through `Ledger.reserve` on nodes small enough to compute by hand, and
its fast path (memo, shared evaluations, candidate walk) against a plain scan.
"""

from __future__ import annotations

import pytest

from gpuledger.core.model import Denial, Device, NodeInfo, Placement, Request
from gpuledger.strategies.fgd_host import HostAwareFGD
from gpuledger.strategies.fragmentation import PodShape, TargetWorkload
from tests.strategies.support import ledger, node_info


def test_share_goes_to_the_device_that_fragments_least():
    half_half = TargetWorkload(((PodShape(0, 1, 500), 0.5), (PodShape(0, 1, 1000), 0.5)))
    led = ledger("fgd", [node_info("n", 2)], half_half)
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
    led = ledger("fgd", [node_info("a", 2), node_info("b", 1)], two_gpu_pods)
    placement = led.reserve(Request("one", gpus=1), 0.0)
    assert placement.node == "b"  # -1000 there, +1000 on a
    explanation = led.explain(Request("two", gpus=1))
    assert explanation.result.node == "a"  # b is full now
    scores = {s.node: s.score for s in explanation.scores}
    assert scores["a"] == pytest.approx(-1000.0)  # a's last idle GPU becomes a fragment for 2-GPU pods
    assert scores["b"] is None


def test_without_a_workload_the_strategy_learns_from_requests_and_is_deterministic():
    def run() -> list[tuple[str, tuple]]:
        led = ledger("fgd", [node_info("a", 4), node_info("b", 2), node_info("c", 8)])
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
    nodes = [node_info("t4", 2, product="T4"), node_info("v100", 1, cpu=1000, product="V100M32")]
    led = ledger("fgd", nodes, workload)
    assert led.reserve(Request("v", gpus=1, product="V100M32"), 0.0).node == "v100"
    denial = led.reserve(Request("w", gpus=1, product="V100M32", cpu_milli=2000), 0.0)
    assert isinstance(denial, Denial)
    assert led.reserve(Request("x", gpus=2, product="T4"), 0.0).node == "t4"


@pytest.mark.parametrize("strategy", ["fgd", "fgd_host", "best_fit"])
def test_a_gpu_spec_or_list_admits_either_model(strategy):
    workload = TargetWorkload.from_shapes([PodShape(0, 1, 1000)])
    nodes = [
        node_info("a-t4", 4, product="T4"),
        node_info("b-v100", 1, product="V100M16"),
        node_info("c-v100", 2, product="V100M32"),
    ]
    led = ledger(strategy, nodes, workload)
    first = led.reserve(Request("one", gpus=1, product="V100M16|V100M32"), 0.0)
    second = led.reserve(Request("two", gpus=2, product="V100M16|V100M32"), 0.0)
    assert {first.node, second.node} == {"b-v100", "c-v100"}
    assert isinstance(led.reserve(Request("three", gpus=1, product="V100M16|V100M32"), 0.0), Denial)


def test_pods_ask_for_them_by_annotation_and_live_admission_learns_the_workload():
    from gpuledger.core.pods.request import request_from_pod

    def pod(name: str, strategy: str, gpus: int) -> dict:
        return {
            "metadata": {"name": name, "annotations": {"agentaflow.gpu/scheduling-strategy": strategy}},
            "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}]},
        }

    # no workload input: fgd learns from requests
    led = ledger("best_fit", [node_info("a", 2), node_info("b", 1)])
    first = request_from_pod(pod("p1", "fgd-host", 2), None, reservation_id="p1")
    assert first.strategy == "fgd_host"
    assert led.reserve(first, 0.0).node == "a"
    second = request_from_pod(pod("p2", "FGD", 1), None, reservation_id="p2")
    assert second.strategy == "fgd" and led.reserve(second, 0.0).node == "b"


class _Unmemoised(HostAwareFGD):
    """fgd_host without its fast path: every node scored by the ledger, every evaluation recomputed."""

    name = "fgd_host_unmemoised"

    def candidates(self, request, ctx, leaves):
        return None

    def _evaluate(self, node, request, cache):
        return self._compute(node, request, cache.meter)


@pytest.mark.parametrize("seed", range(10))
def test_the_fast_path_decides_exactly_as_a_plain_scan(seed):
    """Memo, shared evaluations and candidate walk change nothing, with releases, memory shares, unhealthy
    devices, CPU-only pods and product constraints in the mix."""
    import random

    from gpuledger.strategies import register

    register("fgd_host_unmemoised", _Unmemoised)
    rng = random.Random(seed)
    nodes = []
    for i in range(8):
        product = rng.choice(["T4", "V100M16", "V100M32"])
        gpus = rng.choice([0, 1, 2, 4, 8])
        devices = tuple(
            Device(d, product=product, memory_mib=16_000, healthy=rng.random() > 0.1) for d in range(gpus)
        )
        nodes.append(NodeInfo(f"n{i}", rng.choice([16_000, 64_000]), 256_000, devices, product=product))
    requests = []
    for i in range(120):
        kind = rng.random()
        cpu = rng.choice([0, 2000, 8000, 12_000])
        product = rng.choice([None, None, "V100M16|V100M32", "T4"])
        if kind < 0.35:
            requests.append(Request(f"r{i}", gpus=rng.choice([1, 1, 2, 4]), cpu_milli=cpu, product=product))
        elif kind < 0.6:
            requests.append(Request(f"r{i}", gpu_milli=rng.choice([110, 250, 460, 810]), cpu_milli=cpu))
        elif kind < 0.85:
            requests.append(Request(f"r{i}", gpu_memory_mib=rng.choice([2000, 8000]), cpu_milli=cpu))
        else:
            requests.append(Request(f"r{i}", cpu_milli=cpu or 4000))
    workload = TargetWorkload.from_requests(requests)

    def decisions(strategy: str) -> list:
        led = ledger(strategy, nodes, workload)
        out, held = [], []
        for request in requests:
            if held and rng_release.random() < 0.2:
                led.release(held.pop(rng_release.randrange(len(held))))
            result = led.reserve(request, 0.0)
            if isinstance(result, Placement):
                held.append(request.id)
                out.append((result.node, result.devices, tuple((s.device, s.milli) for s in result.shares)))
            else:
                out.append(None)
        return out

    rng_release = random.Random(seed)
    fast = decisions("fgd_host")
    rng_release = random.Random(seed)
    plain = decisions("fgd_host_unmemoised")
    assert fast == plain
    assert sum(d is not None for d in fast) > 20


def test_a_device_held_only_by_a_memory_share_is_not_taken_for_a_whole_gpu():
    workload = TargetWorkload.from_shapes([PodShape(0, 1, 1000)])
    gpu_node = NodeInfo("n", 64_000, 256_000, (Device(0, memory_mib=16_000), Device(1, memory_mib=16_000)))
    led = ledger("fgd", [gpu_node], workload)
    assert led.explain(Request("look", gpus=1)).result.devices == (0,)  # evaluated (and memoised) while idle
    memory_share = led.reserve(Request("mem", gpu_memory_mib=4000), 0.0)
    assert memory_share.shares[0].device == 0 and memory_share.shares[0].milli == 0
    # device 0 still reads 1000 milli free, but it is shared now: the whole GPU must be device 1
    assert led.reserve(Request("whole", gpus=1), 0.0).devices == (1,)
