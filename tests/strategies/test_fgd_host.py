"""fgd_host: FGD plus the GPUs a node's CPU and memory could no longer feed."""

from __future__ import annotations

import pytest

from allocator.core.model import Request
from allocator.strategies.fragmentation import PodShape, TargetWorkload
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
