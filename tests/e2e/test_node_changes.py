"""Node changes reach the ledger through the sync: cordon, taints, capacity, labels and device health."""

from __future__ import annotations

import json

import pytest

from devcluster.nodes import DEVICES_ANNOTATION, create_nodes, device_entries, make_node, patch_node
from tests.e2e.conftest import gpu_pod_yaml

pytestmark = pytest.mark.e2e


@pytest.fixture
def own_node(apiserver, stack):
    """A node of its own (in a leaf no other test selects), removed afterwards."""
    name = "changes-node"
    node = make_node(name, "spine-9", "leaf-changes", gpus=4, agentaflow=True)
    create_nodes(apiserver.api_client(), [node])
    apiserver.wait_for(lambda: name in stack.call("snapshot")["nodes"], what="node in the ledger")
    yield name
    apiserver.kubectl("delete", "node", name, "--ignore-not-found")


def attempt(workloads, name: str, node: str, gpus: int = 1, **spec):
    return workloads.apply(
        gpu_pod_yaml(name, gpus=gpus, spec={"nodeSelector": {"kubernetes.io/hostname": node}, **spec}),
        check=False,
    )


def until_admitted(apiserver, workloads, name: str, node: str, gpus: int = 1, what: str = ""):
    apiserver.wait_for(
        lambda: attempt(workloads, name, node, gpus).returncode == 0,
        timeout=30,
        interval=0.3,
        what=what or f"{name} admitted on {node}",
    )


def until_denied(apiserver, workloads, name: str, node: str, reason: str, gpus: int = 1):
    def denied():
        proc = attempt(workloads, name, node, gpus)
        if proc.returncode == 0:  # the change had not reached the ledger yet: undo and try again
            workloads.cp.kubectl("delete", "pod", name, "-n", workloads.namespace)
            return None
        return reason in proc.stderr and proc.stderr

    return apiserver.wait_for(denied, timeout=30, interval=0.3, what=f"denial naming {reason!r}")


def test_cordon_and_uncordon(apiserver, workloads, own_node):
    apiserver.kubectl("cordon", own_node)
    until_denied(apiserver, workloads, "cordoned", own_node, "not ready or cordoned")
    apiserver.kubectl("uncordon", own_node)
    until_admitted(apiserver, workloads, "cordoned", own_node)


def test_new_taint_is_respected_and_a_gpu_taint_tolerated(apiserver, workloads, own_node):
    apiserver.kubectl("taint", "node", own_node, "dedicated=infra:NoSchedule")
    until_denied(apiserver, workloads, "tainted", own_node, "untolerated taint")
    apiserver.kubectl("taint", "node", own_node, "dedicated-")
    apiserver.kubectl("taint", "node", own_node, "nvidia.com/gpu=true:NoSchedule")
    until_admitted(apiserver, workloads, "tainted", own_node)


def test_unhealthy_device_is_never_placed(apiserver, workloads, own_node):
    entries = device_entries(own_node, 4, "NVIDIA-A100-SXM4-80GB", 81920, unhealthy=[0, 1, 2])
    patch_node(
        apiserver.api_client(),
        own_node,
        {"metadata": {"annotations": {DEVICES_ANNOTATION: json.dumps(entries)}}},
    )
    until_denied(apiserver, workloads, "two", own_node, "no placement", gpus=2)
    until_admitted(apiserver, workloads, "one", own_node, gpus=1)
    assert workloads.placement("one").devices == (3,)


def test_label_change_moves_a_node_out_of_a_selected_leaf(apiserver, workloads, own_node):
    selector = {"topology.scheduler/leaf": "leaf-changes"}
    proc = workloads.apply(gpu_pod_yaml("by-leaf", spec={"nodeSelector": selector}), check=False)
    assert proc.returncode == 0, proc.stderr
    apiserver.kubectl("label", "node", own_node, "--overwrite", "topology.scheduler/leaf=leaf-moved")

    def denied():
        proc = workloads.apply(gpu_pod_yaml("by-leaf-2", spec={"nodeSelector": selector}), check=False)
        if proc.returncode == 0:
            workloads.cp.kubectl("delete", "pod", "by-leaf-2", "-n", workloads.namespace)
            return None
        return "no placement" in proc.stderr

    apiserver.wait_for(denied, timeout=30, interval=0.3, what="no node left in leaf-changes")


def test_node_removed_and_capacity_lowered(apiserver, stack, workloads, own_node):
    # a node without the device annotation takes its GPU count from allocatable
    name = "changes-capacity"
    create_nodes(apiserver.api_client(), [make_node(name, "spine-9", "leaf-capacity", gpus=8)])
    try:
        until_admitted(apiserver, workloads, "eight", name, gpus=8, what="8 GPUs before the change")
        workloads.cp.kubectl("delete", "pod", "eight", "-n", workloads.namespace)
        patch_node(
            apiserver.api_client(),
            name,
            {"status": {"allocatable": {"nvidia.com/gpu": "2"}, "capacity": {"nvidia.com/gpu": "2"}}},
            status=True,
        )
        until_denied(apiserver, workloads, "eight", name, "no placement", gpus=8)
        until_admitted(apiserver, workloads, "two", name, gpus=2)
    finally:
        apiserver.kubectl("delete", "node", name, "--ignore-not-found")
    apiserver.wait_for(
        lambda: name not in stack.call("snapshot")["nodes"], what="node removed from the ledger"
    )
