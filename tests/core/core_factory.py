"""Kubernetes object builders shared by the allocator core's tests (plain dicts, as `kubectl get -o yaml`)."""

from __future__ import annotations

import json

from gpuledger.core.model import Placement
from gpuledger.core.pods import objects as kube
from gpuledger.core.pods import placement_codec


def node(
    name: str,
    gpus: int = 8,
    *,
    spine: str = "s1",
    leaf: str = "l1",
    cpu: str = "64",
    memory: str = "512Gi",
    product: str = "NVIDIA-A100-SXM4-40GB",
    gpu_memory: int | None = 40960,
    labels: dict | None = None,
    taints: list | None = None,
    ready: bool = True,
    unschedulable: bool = False,
    devices: list | None = None,
) -> dict:
    all_labels = {
        "kubernetes.io/hostname": name,
        "topology.scheduler/spine": spine,
        "topology.scheduler/leaf": leaf,
    }
    if product:
        all_labels["nvidia.com/gpu.product"] = product
    if gpu_memory is not None:
        all_labels["nvidia.com/gpu.memory"] = str(gpu_memory)
    all_labels.update(labels or {})
    obj = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": all_labels, "annotations": {}},
        "spec": {"taints": taints or [], **({"unschedulable": True} if unschedulable else {})},
        "status": {
            "allocatable": {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus), "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }
    if devices is not None:
        obj["metadata"]["annotations"][kube.DEVICES_ANNOTATION] = json.dumps(devices)
    return obj


def pod(
    name: str,
    *,
    namespace: str = "default",
    node_name: str | None = None,
    gpus: int = 0,
    cpu: str | None = None,
    memory: str | None = None,
    phase: str = "Running",
    placement: Placement | None = None,
    key: bytes = b"",
    annotations: dict | None = None,
) -> dict:
    requests: dict = {}
    limits: dict = {}
    if cpu:
        requests["cpu"] = cpu
    if memory:
        requests["memory"] = memory
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    ann = dict(annotations or {})
    if placement is not None:
        ann[kube.PLACEMENT_ANNOTATION] = placement_codec.encode_placement(placement, key)
        node_name = node_name or placement.node
    spec: dict = {
        "containers": [{"name": "main", "image": "x", "resources": {"requests": requests, "limits": limits}}]
    }
    if node_name:
        spec["nodeName"] = node_name
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "annotations": ann,
            "uid": f"uid-{namespace}-{name}",
        },
        "spec": spec,
        "status": {"phase": phase},
    }


def leafy_cluster(spines: int = 1, leaves: int = 4, per_leaf: int = 4, gpus: int = 8) -> list[dict]:
    """Nodes named s{spine}-l{leaf}-n{i} in leaves l1..lN of spines s1..sM."""
    out = []
    for s in range(1, spines + 1):
        for leaf in range(1, leaves + 1):
            for i in range(1, per_leaf + 1):
                out.append(node(f"s{s}-l{leaf:02d}-n{i}", gpus, spine=f"s{s}", leaf=f"s{s}-leaf{leaf}"))
    return out


def rebuilt_the_long_way(objects: list[dict], config) -> dict:
    """The snapshot of a ledger rebuilt with every pod read by `kube.pod_usage` (not `bound_claim_of_pod`)
    and every claim settled by the general path (`Claims.settle`), not the first-holder shortcut: the
    property tests compare it with the shortcuts' rebuild and the live one."""
    from unittest import mock

    from gpuledger.core.books import adoption
    from gpuledger.core.books.claims import Claims
    from gpuledger.core.ledger import Ledger

    with (
        mock.patch.object(Claims, "_first_holder", return_value=False),
        mock.patch.object(adoption, "bound_claim_of_pod", return_value=None),
    ):
        return Ledger.rebuild(objects, config).snapshot()


def rebuilt_without_adopting_at_once(objects: list[dict], config) -> dict:
    """The snapshot of a ledger rebuilt with the stored pods read straight from their objects but every claim
    put through `Claims.put` (its first-holder shortcut included), not `Adoption._adopt_at_once`: the
    property tests compare it too, so both shortcuts stay tested on their own."""
    from unittest import mock

    from gpuledger.core.books.adoption import Adoption
    from gpuledger.core.ledger import Ledger

    with mock.patch.object(Adoption, "_adopt_at_once", return_value=False):
        return Ledger.rebuild(objects, config).snapshot()
