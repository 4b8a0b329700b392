"""A gang's pods admitted one at a time, as the webhook parses them from a Job's pods, on devcluster's sample
clusters: every answer (node, devices, slot, the plan it carries), every release and the ledger's snapshots,
digested and compared with the digest recorded before a gang's slot claims were indexed (the smallest
unclaimed slot and the plan in slot order kept by the gang instead of recomputed per pod, the claimed slots
counted). Any change to what a gang's pods are given, or to what their ends free, shows as a changed digest.

Each case: the whole gang arrives; every fifth pod ends before the gang's deadline (its slot is held again,
unclaimed) and a new pod takes each; a second, half-size gang arrives, and a third with a third of its pods;
after the deadline three pods of the first end (their slots go) and three new pods arrive (each placed anew
near the gang); then every pod ends (the third gang's unclaimed slots go with its last pod).
"""

from __future__ import annotations

import hashlib
import json

import pytest

import gpuledger.strategies  # noqa: F401  (the strategies register themselves)
from devcluster.nodes import make_sample_cluster
from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Placement
from gpuledger.core.pods.request import request_from_pod

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
    third = _owner("c", size, annotations)  # a third of its pods: the rest of its slots stay unclaimed
    for i in range(max(1, size // 3)):
        admit(third, f"c-{i}", 3.0)
    late = TTL + 10.0
    for i in range(3):  # ended after the deadline: their slots go, new pods are placed near the gang
        admit(first, f"a-probe-{i}", late)  # (the gang is whole: denied)
        led.release(f"r-a-{i}")
    for i in range(3):
        admit(first, f"a-late-{i}", late)
    answers.append(led.snapshot())
    for rid in sorted(led.reservations()):  # every pod ends: its gang's slots go with the last
        answers.append([rid, led.release(rid)])
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
        "0bcd3dd85a03760cb8efd8259ec23574dcf0cb6402accc0655cd0b3831924a7d"
    ),
    "300 nodes, 200 pods x 1 GPU, distributed": (
        "cdc50e42d98d46d80fa736980b9b14c8095f7a15c1b15ce8263d232225bd281c"
    ),
    "500 nodes, 512 pods x 1 GPU, spine-0": (
        "5c8b547f253ead8ded7193ad97ebdfef60a173dd0eeba8f5aa22183346737547"
    ),
    "64 nodes, 8 pods x 1 GPU, spine-0": ("1ab5303348e6ab1d8298451d3a3247f6fa2369a2ce92e4ba1b89f5dded236f5d"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_gang_answers_unchanged(case: str) -> None:
    assert gang_digest(*CASES[case]) == RECORDED[case]


if __name__ == "__main__":  # prints the digests to record
    for name in sorted(CASES):
        print(f"    {name!r}: {gang_digest(*CASES[name])!r},")
