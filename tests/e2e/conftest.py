"""End-to-end fixtures: the sample GPU cluster in the shared control plane, and the running product on it."""

from __future__ import annotations

import json
import time

import pytest
import yaml

from devcluster import images
from devcluster.nodes import create_nodes, make_sample_cluster
from devcluster.stack import Stack, e2e_webhook_config

SAMPLE_NODES = make_sample_cluster()  # 2 spines, 4 leaves, 16 nodes x 8 GPUs; node-3 of each leaf tainted


@pytest.fixture(scope="session")
def gpu_nodes(apiserver):
    existing = {n["metadata"]["name"] for n in apiserver.get_json("nodes")["items"]}
    create_nodes(apiserver.api_client(), [n for n in SAMPLE_NODES if n["metadata"]["name"] not in existing])
    return SAMPLE_NODES


@pytest.fixture(scope="package")
def stack(apiserver, gpu_nodes):
    """Ray ledger actor + cluster sync + TLS webhook, registered with failurePolicy Fail.

    Package scope: Ray is shut down once tests/e2e is done, before other tests start a Ray of their own.
    """
    # when_full: the suite's pods that do not fit are refused, as before waiting existed; the tests of waiting
    # pods (tests/e2e/test_waiting_pods.py) reconfigure the webhook to the default, wait
    with Stack(apiserver, config=e2e_webhook_config(when_full="refuse")) as running:
        yield running


class Workloads:
    """kubectl apply as the user alice, and reading back what admission did."""

    def __init__(self, cp, stack: Stack, namespace: str):
        self.cp, self.stack, self.namespace = cp, stack, namespace

    def apply(self, text: str, check: bool = True, user: str = "alice", extra: tuple[str, ...] = ()):
        return self.cp.kubectl(
            "apply", "-n", self.namespace, *extra, "-f", "-", input=text, as_user=user, check=check
        )

    def pods(self, selector: str | None = None) -> list[dict]:
        return self.cp.pods(self.namespace, selector)

    def wait_pods(self, count: int, selector: str | None = None, timeout: float = 60) -> list[dict]:
        return self.cp.wait_for(
            lambda: (lambda pods: pods if len(pods) >= count else None)(self.pods(selector)),
            timeout=timeout,
            what=f"{count} pods ({selector or 'all'}) in {self.namespace}",
        )

    def pod(self, name: str) -> dict:
        return self.cp.get_json("pod", name, "-n", self.namespace)

    def placement(self, pod: dict | str):
        return self.stack.placement(self.pod(pod) if isinstance(pod, str) else pod)

    def wait_confirmed(self, pods: list[dict], timeout: float = 30):
        """Until the ledger holds every pod's reservation as confirmed (the sync saw the stored pods)."""
        ids = [self.placement(p).id for p in pods]

        def confirmed():
            held = self.stack.call("lookup", ids)
            return all(h is not None and h.confirmed for h in held)

        return self.cp.wait_for(confirmed, timeout=timeout, what=f"{len(ids)} reservations confirmed")


@pytest.fixture
def workloads(apiserver, stack, namespace):
    return Workloads(apiserver, stack, namespace)


def device_owners(stack: Stack, nodes: list[str]) -> dict[str, list]:
    """node -> [owner or None per device], and unknown GPUs, from the ledger's canonical snapshot."""
    snap = stack.call("snapshot")["nodes"]
    return {n: ([d[3] for d in snap[n]["devices"]], snap[n]["unknown_gpus"]) for n in nodes}


def wait_nodes_free(apiserver, stack: Stack, nodes: list[str], timeout: float = 60) -> None:
    """Until the ledger holds nothing on `nodes` (earlier tests' pods are released asynchronously)."""

    def free():
        owners = device_owners(stack, nodes)
        return all(all(o is None for o in devs) and unknown == 0 for devs, unknown in owners.values())

    apiserver.wait_for(free, timeout=timeout, what=f"nodes {nodes} free in the ledger")


def stable_snapshot(stack: Stack, quiet_s: float = 1.0, timeout: float = 30) -> dict:
    """The ledger's snapshot once it stopped changing for `quiet_s` (events from earlier tests have
    landed)."""
    deadline = time.monotonic() + timeout
    last = stack.call("snapshot")
    while time.monotonic() < deadline:
        time.sleep(quiet_s)
        now = stack.call("snapshot")
        if json.dumps(now, sort_keys=True, default=str) == json.dumps(last, sort_keys=True, default=str):
            return now
        last = now
    raise TimeoutError("the ledger kept changing")


def gpu_pod_yaml(name: str, gpus: int = 1, annotations: dict | None = None, spec: dict | None = None) -> str:
    """A pod asking for `gpus` GPUs through container limits, as a user would write it."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "annotations": annotations or {}},
        "spec": {
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvcr.io/nvidia/cuda:12.4.0-base-ubuntu22.04",
                    "resources": {"limits": {"nvidia.com/gpu": str(gpus)}, "requests": {"cpu": "100m"}},
                }
            ],
            **(spec or {}),
        },
    }
    return yaml.safe_dump(pod)


def busybox_pod(
    name: str,
    command: str,
    gpus: int = 0,
    *,
    node: str | None = None,
    host: str | None = None,
    annotations: dict | None = None,
    namespace: str | None = None,
) -> dict:
    """A pod the real node can run (the locally built test image, never pulled) running `sh -c command`,
    bound by `spec.nodeName` to `node` or selecting `host` by its hostname label, asking for `gpus` GPUs."""
    container: dict = {
        "name": "main",
        "image": images.TEST_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["sh", "-c", command],
    }
    if gpus:
        container["resources"] = {"limits": {"nvidia.com/gpu": str(gpus)}}
    metadata: dict = {"name": name}
    if annotations is not None:
        metadata["annotations"] = annotations
    if namespace is not None:
        metadata["namespace"] = namespace
    spec: dict = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "containers": [container]}
    if node is not None:
        spec["nodeName"] = node
    if host is not None:
        spec["nodeSelector"] = {"kubernetes.io/hostname": host}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
