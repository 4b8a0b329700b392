"""A sample GPU cluster as Node objects: leaf/spine topology, GFD labels, taints and device annotations.

One builder feeds the end-to-end tests, the demo and the sample `--cluster` file for `gpuledger explain`
(`python -m devcluster.nodes > devcluster/samples/cluster.yaml`), so they never drift apart.
No kubelet runs: nodes are created through the API and their status is patched to what a kubelet with the
NVIDIA device plugin and GPU Feature Discovery would report.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterable

import yaml

from gpuledger.names import (
    DEVICES_ANNOTATION,
    GPU_COUNT_LABEL,
    GPU_MEMORY_LABEL,
    GPU_RESOURCE,
    HOSTNAME_LABEL,
    LEAF_LABEL,
    NETWORK_BANDWIDTH_LABEL,
    PRODUCT_LABEL,
    SCHEDULABLE_LABEL,
    SPINE_LABEL,
)

GPU_TAINT = {"key": GPU_RESOURCE, "value": "true", "effect": "NoSchedule"}

# (GFD product label, memory in MiB) per spine, cycling
PRODUCTS = (("NVIDIA-A100-SXM4-80GB", 81920), ("NVIDIA-H100-80GB-HBM3", 81559))

# network bandwidth in Gbit/s per leaf, cycling: leaf-0 100, leaf-1 200, every other leaf 400
BANDWIDTHS = (100, 200)
DEFAULT_BANDWIDTH = 400

# a fixed timestamp keeps the builder deterministic (the sample file is compared to it in a test)
STAMP = "2025-01-01T00:00:00Z"


def device_uuid(node: str, index: int) -> str:
    return "GPU-" + str(uuid.uuid5(uuid.NAMESPACE_DNS, f"{node}/{index}"))


def device_entries(
    node: str, gpus: int, product: str, memory_mib: int, unhealthy: Iterable[int] = ()
) -> list[dict]:
    """The `agentaflow.gpu/devices` annotation a node agent (gpuledger.node_agent.probes) would write."""
    bad = set(unhealthy)
    return [
        {
            "index": i,
            "uuid": device_uuid(node, i),
            "product": product,
            "memoryMiB": memory_mib,
            "healthy": i not in bad,
            "utilization": 0,
            **({"reason": "XID 79: fallen off the bus"} if i in bad else {}),
        }
        for i in range(gpus)
    ]


def make_node(
    name: str,
    spine: str,
    leaf: str,
    gpus: int = 8,
    product: str = PRODUCTS[0][0],
    memory_mib: int = PRODUCTS[0][1],
    tainted: bool = False,
    agentaflow: bool = False,
    cpu: int = 64,
    memory_gi: int = 512,
    unhealthy: Iterable[int] = (),
    bandwidth_gbps: int | None = DEFAULT_BANDWIDTH,
) -> dict:
    labels = {
        HOSTNAME_LABEL: name,
        "kubernetes.io/os": "linux",
        "kubernetes.io/arch": "amd64",
        "nvidia.com/gpu.present": "true",
        PRODUCT_LABEL: product,
        GPU_MEMORY_LABEL: str(memory_mib),
        "nvidia.com/gpu.count": str(gpus),
        SPINE_LABEL: spine,
        LEAF_LABEL: leaf,
    }
    if bandwidth_gbps is not None:
        labels[NETWORK_BANDWIDTH_LABEL] = str(bandwidth_gbps)
    annotations: dict[str, str] = {}
    if agentaflow:
        labels.update(
            {
                SCHEDULABLE_LABEL: "true",
                "agentaflow.gpu/product": product,
                GPU_COUNT_LABEL: str(gpus),
            }
        )
        annotations[DEVICES_ANNOTATION] = json.dumps(
            device_entries(name, gpus, product, memory_mib, unhealthy), separators=(",", ":")
        )
    resources = {
        "cpu": str(cpu),
        "memory": f"{memory_gi}Gi",
        "pods": "110",
        "ephemeral-storage": "1000Gi",
        GPU_RESOURCE: str(gpus),
    }
    allocatable = dict(resources, cpu=f"{cpu * 1000 - 500}m", memory=f"{memory_gi * 1024 - 2048}Mi")
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels, "annotations": annotations},
        "spec": {"taints": [dict(GPU_TAINT)]} if tainted else {},
        "status": {
            "capacity": resources,
            "allocatable": allocatable,
            "conditions": [
                {
                    "type": "Ready",
                    "status": "True",
                    "reason": "KubeletReady",
                    "message": "kubelet is posting ready status",
                    "lastHeartbeatTime": STAMP,
                    "lastTransitionTime": STAMP,
                }
            ],
            "addresses": [{"type": "Hostname", "address": name}],
            "nodeInfo": {
                "architecture": "amd64",
                "operatingSystem": "linux",
                "kubeletVersion": "v1.37.2",
                "kubeProxyVersion": "",
                "containerRuntimeVersion": "containerd://2.4.2",
                "kernelVersion": "6.8.0",
                "osImage": "Ubuntu 24.04 LTS",
                "bootID": "",
                "machineID": "",
                "systemUUID": "",
            },
        },
    }


def make_sample_cluster(
    spines: int = 2,
    leaves_per_spine: int = 2,
    nodes_per_leaf: int = 4,
    gpus_per_node: int = 8,
    tainted_per_leaf: int = 1,
    agentaflow_per_leaf: int = 2,
) -> list[dict]:
    """Spines `spine-S`, leaves `leaf-L` numbered across spines, nodes `leaf-L-node-N`.

    In every leaf the last `tainted_per_leaf` nodes carry `nvidia.com/gpu=true:NoSchedule` and the first
    `agentaflow_per_leaf` nodes carry agentaflow labels and a device annotation; spines alternate GPU
    products; every node carries its leaf's network bandwidth (`BANDWIDTHS`: leaf-0 100 Gbit/s, leaf-1
    200, others 400).
    """
    nodes = []
    for s in range(spines):
        product, memory = PRODUCTS[s % len(PRODUCTS)]
        for l_in_spine in range(leaves_per_spine):
            leaf_number = s * leaves_per_spine + l_in_spine
            leaf = f"leaf-{leaf_number}"
            bandwidth = BANDWIDTHS[leaf_number] if leaf_number < len(BANDWIDTHS) else DEFAULT_BANDWIDTH
            for n in range(nodes_per_leaf):
                nodes.append(
                    make_node(
                        f"{leaf}-node-{n}",
                        spine=f"spine-{s}",
                        leaf=leaf,
                        gpus=gpus_per_node,
                        product=product,
                        memory_mib=memory,
                        tainted=n >= nodes_per_leaf - tainted_per_leaf,
                        agentaflow=n < agentaflow_per_leaf,
                        bandwidth_gbps=bandwidth,
                    )
                )
    return nodes


def as_list(objects: list[dict]) -> dict:
    return {"apiVersion": "v1", "kind": "List", "items": objects}


def create_nodes(api_client, nodes: list[dict]) -> None:
    """Create each Node, then patch its status subresource (what a kubelet's registration would do)."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    for node in nodes:
        body = {k: v for k, v in node.items() if k != "status"}
        core.create_node(body=body)  # type: ignore[arg-type]  # the client sends a plain dict body as is
        core.patch_node_status(node["metadata"]["name"], body={"status": node["status"]})


def patch_node(api_client, name: str, body: dict, status: bool = False) -> dict:
    """Strategic-merge patch a node (or its status), returned as a plain dict."""
    from kubernetes import client

    core = client.CoreV1Api(api_client)
    fn = core.patch_node_status if status else core.patch_node
    return api_client.sanitize_for_serialization(fn(name, body=body))


def main(argv: list[str] | None = None) -> int:
    sys.stdout.write(
        "# generated by `python -m devcluster.nodes`: two spines, four leaves, 16 nodes x 8 GPUs\n"
    )
    sys.stdout.write(yaml.safe_dump(as_list(make_sample_cluster()), sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
