"""Many clients at once, fewer GPUs than pods: every stored pod holds devices no other stored pod holds."""

from __future__ import annotations

import threading
from collections import Counter

import pytest

from devcluster.cluster import ADMIN, ALICE
from devcluster.stack import placements_by_device
from tests.e2e.conftest import SAMPLE_NODES, wait_nodes_free

pytestmark = pytest.mark.e2e

LEAF = "leaf-3"
LEAF_NODES = [
    n["metadata"]["name"] for n in SAMPLE_NODES if n["metadata"]["labels"]["topology.scheduler/leaf"] == LEAF
]
CLIENTS, PODS_PER_CLIENT = 4, 50


def gpu_pod(name: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"topology.scheduler/leaf": LEAF},
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ],
        },
    }


def test_200_concurrent_pods_for_32_gpus_never_share_a_device(apiserver, stack, namespace):
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    wait_nodes_free(apiserver, stack, LEAF_NODES)
    capacity = 8 * len(LEAF_NODES)
    outcomes: Counter = Counter()
    errors: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(CLIENTS)

    def run(index: int) -> None:
        core = client.CoreV1Api(apiserver.api_client(ALICE if index % 2 else ADMIN))
        barrier.wait()
        for i in range(PODS_PER_CLIENT):
            try:
                core.create_namespaced_pod(namespace, gpu_pod(f"c{index}-p{i}"))
                outcome = "created"
            except ApiException as exc:
                outcome = (
                    "denied"
                    if exc.status == 403 and "no placement" in str(exc.body)
                    else f"error {exc.status}"
                )
                if outcome != "denied":
                    with lock:
                        errors.append(str(exc.body)[:300])
            with lock:
                outcomes[outcome] += 1

    threads = [threading.Thread(target=run, args=(i,)) for i in range(CLIENTS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)

    assert not errors, errors[:3]
    assert outcomes == {"created": capacity, "denied": CLIENTS * PODS_PER_CLIENT - capacity}
    pods = apiserver.pods(namespace)
    assert len(pods) == capacity
    held = placements_by_device(stack, pods)
    doubles = {k: v for k, v in held.items() if len(v) > 1}
    assert not doubles, doubles
    assert set(held) == {(node, d) for node in LEAF_NODES for d in range(8)}
