"""Pod-level resources through the real path: a pod whose `spec.resources` gives its CPU and memory is
admitted by kubectl, and the ledger counts on its node what kube-scheduler counts: the pod-level figures, not
its containers'. The ledger rebuilt from the API server counts the same.

On an API server that drops the field (Kubernetes before 1.34, where the feature is off by default) the stored
pod has no `spec.resources`, and the ledger counts its containers, as the scheduler of that cluster does."""

from __future__ import annotations

import pytest
import yaml

from devcluster.nodes import create_nodes, make_node
from gpuledger.core.ledger import Ledger, LedgerConfig

pytestmark = pytest.mark.e2e

NODE = "pod-level-node"


@pytest.fixture
def own_node(apiserver, stack):
    """A node of its own with 16 CPUs (in a leaf no other test selects), removed afterwards."""
    create_nodes(apiserver.api_client(), [make_node(NODE, "spine-9", "leaf-pod-level", gpus=2, cpu=16)])
    # the Node is created, then its status patched (create_nodes): wait for the status, not the name
    apiserver.wait_for(
        lambda: stack.call("snapshot")["nodes"].get(NODE, {}).get("cpu_free", 0) > 0,
        what="the node's CPUs in the ledger",
    )
    yield NODE
    apiserver.kubectl("delete", "node", NODE, "--ignore-not-found")


def test_the_ledger_counts_a_pods_own_cpu_and_memory_where_it_sets_them(
    apiserver, stack, workloads, own_node
):
    free_before = stack.call("snapshot")["nodes"][own_node]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pod-level"},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": own_node},
            "resources": {"requests": {"cpu": "6", "memory": "8Gi"}, "limits": {"cpu": "6", "memory": "8Gi"}},
            "containers": [
                {
                    "name": name,
                    "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
                    "resources": {
                        "limits": {"nvidia.com/gpu": "1"},
                        "requests": {"cpu": "1", "memory": "1Gi"},
                    },
                }
                for name in ("main", "helper")
            ],
        },
    }
    workloads.apply(yaml.safe_dump(pod))
    stored = workloads.pod("pod-level")
    placement = workloads.placement(stored)
    assert placement is not None and placement.node == own_node and len(placement.devices) == 2
    workloads.wait_confirmed([stored])
    kept = bool(stored["spec"].get("resources"))
    print(f"\npod-level resources kept by the API server: {kept}")
    if kept:  # the API server keeps pod-level resources (1.34 and later)
        cpu, mem = 6000, 8192
    else:
        cpu, mem = 2000, 2048
    node = stack.call("snapshot")["nodes"][own_node]
    assert free_before["cpu_free"] - node["cpu_free"] == cpu
    assert free_before["mem_free"] - node["mem_free"] == mem
    # rebuilt from what the API server holds, the ledger counts the same
    nodes = apiserver.get_json("nodes")["items"]
    pods = apiserver.get_json("pods", "-A")["items"]
    objects = [{"kind": "Node", **n} for n in nodes] + [{"kind": "Pod", **p} for p in pods]
    config = LedgerConfig(placement_key=stack.config.placement_key())
    rebuilt = Ledger.rebuild(objects, config).snapshot()["nodes"][own_node]
    assert (rebuilt["cpu_free"], rebuilt["mem_free"]) == (node["cpu_free"], node["mem_free"])
