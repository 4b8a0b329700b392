"""A gang's pods admitted one at a time, as the webhook parses them from a Job's pods, on devcluster's sample
clusters: every answer (node, devices, slot, the plan it carries) and the ledger's final snapshot, digested
and compared with the digest recorded before a gang's slot claims were indexed (the smallest unclaimed slot
and the plan in slot order kept by the gang instead of recomputed per pod). Any change to what a gang's pods
are given shows here as a changed digest.

Each case: the whole gang arrives; every fifth pod ends before the gang's deadline (its slot is held again,
unclaimed) and a new pod takes each; a second, half-size gang arrives; after the deadline three pods end
(their slots go) and three new pods arrive (each placed anew near the gang).
"""

from __future__ import annotations

import hashlib
import json

import pytest

import gpuledger.strategies  # noqa: F401  (the strategies register themselves)
from devcluster.nodes import make_sample_cluster
from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Placement
from gpuledger.core.request import request_from_pod

TTL = LedgerConfig().reservation_ttl_s


def _nodes(count: int) -> list[dict]:
    nodes = make_sample_cluster(
        spines=-(-count // 64),
        leaves_per_spine=8,
        nodes_per_leaf=8,
        gpus_per_node=8,
        tainted_per_leaf=0,
        agentaflow_per_leaf=0,
    )
    return nodes[:count]


def _owner(name: str, pods: int, annotations: dict) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name, "namespace": "gang", "annotations": annotations},
        "spec": {"parallelism": pods, "completions": pods},
    }


def _pod(name: str, gpus: int) -> dict:
    resources = {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"cpu": "1", "memory": "4Gi"}}
    return {
        "metadata": {"name": name, "namespace": "gang"},
        "spec": {"containers": [{"name": "main", "image": "x", "resources": resources}]},
    }


def _answer(result) -> list:
    if not isinstance(result, Placement):
        return [type(result).__name__, getattr(result, "message", "")[:120]]
    plan = [[s.slot, s.node, list(s.devices)] for s in result.group_plan]
    return [
        result.id,
        result.node,
        list(result.devices),
        result.slot,
        hashlib.sha256(repr(plan).encode()).hexdigest(),
    ]


def gang_digest(nodes: int, size: int, gpus: int, annotations: dict) -> str:
    led = Ledger.rebuild(_nodes(nodes), LedgerConfig(placement_key=b"k"), now=0.0)
    answers: list = []

    def admit(job: dict, pod_name: str, now: float) -> None:
        req = request_from_pod(_pod(pod_name, gpus), job, reservation_id=f"r-{pod_name}", namespace="gang")
        answers.append(_answer(led.reserve_or_wait(req, now, True)))

    first = _owner("a", size, annotations)
    for i in range(size):
        admit(first, f"a-{i}", 0.0)
    for i in range(2, size, 5):  # ended before the deadline: their slots held again, then taken
        led.release(f"r-a-{i}")
    for i in range(2, size, 5):
        admit(first, f"a-again-{i}", 1.0)
    second = _owner("b", size // 2, annotations)
    for i in range(size // 2):
        admit(second, f"b-{i}", 2.0)
    late = TTL + 10.0
    for i in range(3):  # ended after the deadline: their slots go, new pods are placed near the gang
        admit(first, f"a-probe-{i}", late)  # (the gang is whole: denied)
        led.release(f"r-a-{i}")
    for i in range(3):
        admit(first, f"a-late-{i}", late)
    answers.append(led.snapshot())
    return hashlib.sha256(json.dumps(answers, sort_keys=True, default=str).encode()).hexdigest()


SPINE_0 = {"topology.scheduler/gang": "true", "topology.scheduler/preferred-domain": "spine-0"}
CASES = {
    "64 nodes, 8 pods x 1 GPU, spine-0": (64, 8, 1, SPINE_0),
    "500 nodes, 512 pods x 1 GPU, spine-0": (500, 512, 1, SPINE_0),
    "1000 nodes, 300 pods x 2 GPUs, spine-1": (
        1000,
        300,
        2,
        {"topology.scheduler/gang": "true", "topology.scheduler/preferred-domain": "spine-1"},
    ),
    "300 nodes, 200 pods x 1 GPU, distributed": (
        300,
        200,
        1,
        {"topology.scheduler/gang": "true", "topology.scheduler/placement-strategy": "distributed"},
    ),
}

# recorded with the slot claims recomputed per pod (a scan of the gang's claims, its slots sorted per pod)
RECORDED = {
    "1000 nodes, 300 pods x 2 GPUs, spine-1": (
        "5814f576ac98e69319632101347f261841e43d4307bc08eae56f273639279d82"
    ),
    "300 nodes, 200 pods x 1 GPU, distributed": (
        "4c0ef42ebcffda581541b698c9b419fb69b864ee9c1ec3dfcd05c6edf557007c"
    ),
    "500 nodes, 512 pods x 1 GPU, spine-0": (
        "2a731dd5a843d4ff995603fa88d8b5281ccf5a27233d28d3359f3ec2aeb0168a"
    ),
    "64 nodes, 8 pods x 1 GPU, spine-0": "258d967843de38a3280dab45a0ca7b4e1d6c4dec776e2ecddf77799367e711aa",
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gang_answers_unchanged(case: str) -> None:
    assert gang_digest(*CASES[case]) == RECORDED[case]


if __name__ == "__main__":  # prints the digests to record
    for name in sorted(CASES):
        print(f"    {name!r}: {gang_digest(*CASES[name])!r},")
