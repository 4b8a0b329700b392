"""best_fit: the tightest node counting CPU and GPU (its walk's exactness is in test_walks)."""

from __future__ import annotations

from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Request
from tests.core.core_factory import node
from tests.strategies.support import make, take


def test_best_fit_packs_and_least_utilized_spreads():
    led = make(node("a", 8), node("b", 8), node("c", 8))
    take(led, "b", 5, "pre")
    assert led.reserve(Request(id="1", gpus=2, strategy="best_fit"), 0.0).node == "b"
    assert led.reserve(Request(id="2", gpus=2, strategy="leastLoaded"), 0.0).node == "a"
    assert led.reserve(Request(id="3", gpus=2, strategy="least_utilized"), 0.0).node == "c"


def test_best_fit_counts_cpu_so_cpu_pods_leave_gpu_nodes_alone():
    """A CPU-only pod goes to the CPU node, not to the GPU node with less free CPU (stranding its GPUs);
    among GPU nodes, the one whose CPU and GPUs are both fullest after placement wins."""
    from gpuledger.core.model import Device, NodeInfo

    led = Ledger(LedgerConfig())
    gpus = tuple(Device(index=d) for d in range(8))
    led.upsert_node(NodeInfo(name="gpu-small-cpu", cpu_milli=16_000, memory_mib=65536, devices=gpus))
    led.upsert_node(NodeInfo(name="gpu-big-cpu", cpu_milli=96_000, memory_mib=65536, devices=gpus))
    led.upsert_node(NodeInfo(name="cpu-only", cpu_milli=64_000, memory_mib=65536, devices=()))
    # cost after (cpu/96 + gpu/8): gpu-small-cpu 12/96+8/8, gpu-big-cpu 92/96+8/8, cpu-only 60/96+0
    assert led.reserve(Request(id="c", cpu_milli=4000), 0.0).node == "cpu-only"
    # a GPU pod: gpu-small-cpu 12/96+7/8 beats gpu-big-cpu 92/96+7/8
    assert led.reserve(Request(id="g", gpus=1, cpu_milli=4000), 0.0).node == "gpu-small-cpu"
