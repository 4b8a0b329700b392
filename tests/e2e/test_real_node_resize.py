"""In-place resize on the real kubelet: a GPU pod gpuledger placed is resized with `kubectl patch
--subresource resize`; once the node's kubelet accepts the new size (`allocatedResources`, then the applied
`resources`) the ledger holds the new CPU and memory on the node, its GPUs as placed. More CPU than the node
has is refused (by the API server on 1.37, else the kubelet marks it Infeasible) and not counted; a resize the
kubelet defers (no room beside another pod) is not counted until the kubelet takes it up; and the ledger
rebuilt from the API objects holds what the live one does.

The node is plugin-less and advertises its GPUs as test_real_node_visibility.py's does; kube-scheduler binds
what the webhook placed.
"""

from __future__ import annotations

import json

import pytest
import yaml

from devcluster.cluster import ALICE
from devcluster.kubelet import RealNode
from devcluster.nodes import device_entries
from devcluster.scheduler import KubeScheduler
from gpuledger.core.ledger import Ledger, LedgerConfig
from tests.conftest import require_real_node
from tests.e2e.conftest import busybox_pod

pytestmark = [pytest.mark.e2e, pytest.mark.realnode, pytest.mark.ray]

NODE = "real-node-resize"
GPUS = 2
PRODUCT, MEMORY_MIB = "NVIDIA-A100-SXM4-80GB", 81920
HOLD = "trap 'exit 0' TERM; sleep 3600 & wait"


@pytest.fixture(scope="module")
def node(apiserver, stack):
    """A plugin-less real node advertising GPUS GPUs, known to the suite's ledger, and kube-scheduler."""
    require_real_node()
    with RealNode(apiserver, name=NODE, index=4) as real, KubeScheduler(apiserver):
        real.advertise_gpus(device_entries(NODE, GPUS, PRODUCT, MEMORY_MIB))
        apiserver.wait_for(
            lambda: len((stack.call("snapshot")["nodes"].get(NODE) or {}).get("devices", ())) == GPUS,
            what=f"the ledger knowing {GPUS} GPUs on {NODE}",
        )
        yield stack


def get(apiserver, namespace: str, name: str) -> dict:
    return apiserver.get_json("pod", name, "-n", namespace)


def resize(apiserver, namespace: str, name: str, cpu: str, check: bool = True):
    body = {
        "spec": {
            "containers": [{"name": "main", "resources": {"requests": {"cpu": cpu}, "limits": {"cpu": cpu}}}]
        }
    }
    return apiserver.kubectl(
        "patch", "pod", name, "-n", namespace, "--subresource", "resize", "--type", "strategic",
        "-p", json.dumps(body), check=check,
    )  # fmt: skip


def pending(apiserver, namespace: str, reason: str) -> dict:
    """The pod once its kubelet marks its resize pending for `reason` (Deferred or Infeasible)."""

    def marked():
        p = get(apiserver, namespace, "resized")
        found = [c for c in p["status"].get("conditions") or () if c.get("type") == "PodResizePending"]
        return p if found and found[0].get("reason") == reason else None

    return apiserver.wait_for(marked, timeout=60, what=f"the kubelet marking the resize {reason}")


def allocated_cpu(pod: dict) -> str | None:
    (status,) = pod["status"].get("containerStatuses") or [{}]
    return (status.get("allocatedResources") or {}).get("cpu")


def held(stack, rid: str) -> dict:
    return stack.call("snapshot")["reservations"][rid][1]


def rebuilt_node(apiserver, stack) -> dict:
    nodes = apiserver.get_json("nodes")["items"]
    pods = apiserver.get_json("pods", "-A")["items"]
    objects = [{"kind": "Node", **n} for n in nodes] + [{"kind": "Pod", **p} for p in pods]
    rebuilt = Ledger.rebuild(objects, LedgerConfig(placement_key=stack.config.placement_key()))
    return rebuilt.snapshot()["nodes"][NODE]


def test_the_ledger_holds_what_the_kubelet_accepted_and_not_what_it_refused(apiserver, node, namespace):
    stack = node
    pod = busybox_pod("resized", HOLD, 1, host=NODE)
    pod["spec"]["containers"][0]["resources"] = {
        "limits": {"nvidia.com/gpu": "1", "cpu": "100m", "memory": "64Mi"},
        "requests": {"cpu": "100m", "memory": "64Mi"},
    }
    apiserver.kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(pod), as_user=ALICE)
    running = apiserver.wait_for(
        lambda: (lambda p: p if p["status"].get("phase") == "Running" else None)(
            get(apiserver, namespace, "resized")
        ),
        timeout=90,
        what="the pod running on the real node",
    )
    placement = stack.placement(running)
    assert placement is not None and placement.node == NODE and placement.cpu_milli == 100
    free_before = stack.call("snapshot")["nodes"][NODE]["cpu_free"]
    assert held(stack, placement.id)["cpu"] == 100

    resize(apiserver, namespace, "resized", "300m")
    accepted = apiserver.wait_for(
        lambda: (lambda p: p if allocated_cpu(p) == "300m" else None)(get(apiserver, namespace, "resized")),
        timeout=60,
        what="the kubelet accepting 300m",
    )
    print(f"\naccepted at generation {accepted['metadata'].get('generation')}")
    apiserver.wait_for(lambda: held(stack, placement.id)["cpu"] == 300, what="the ledger holding 300m")
    after = stack.call("snapshot")["nodes"][NODE]
    assert free_before - after["cpu_free"] == 200
    assert held(stack, placement.id)["devices"] == list(placement.devices)  # its GPU as placed
    assert rebuilt_node(apiserver, stack)["cpu_free"] == after["cpu_free"]

    # more CPU than the node has: the API server refuses it (1.37), or the kubelet finds it Infeasible
    too_big = resize(apiserver, namespace, "resized", "64", check=False)
    if too_big.returncode != 0:
        assert "enough allocatable resources" in too_big.stderr, too_big.stderr
        print(f"the API server's answer to 64 CPUs: {too_big.stderr.strip()}")
    else:
        pending(apiserver, namespace, "Infeasible")
        resize(apiserver, namespace, "resized", "300m")
    # more than is free beside another pod: the kubelet defers it, and the ledger counts the size it holds
    filler = busybox_pod("filler", HOLD, 0, host=NODE)
    filler["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "1500m", "memory": "16Mi"}}
    apiserver.kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(filler), as_user=ALICE)
    apiserver.wait_for(
        lambda: get(apiserver, namespace, "filler")["status"].get("phase") == "Running",
        timeout=90,
        what="filler",
    )
    filled = stack.call("snapshot")["nodes"][NODE]["cpu_free"]
    assert filled == after["cpu_free"] - 1500
    resize(apiserver, namespace, "resized", "1")
    deferred = pending(apiserver, namespace, "Deferred")
    assert deferred["spec"]["containers"][0]["resources"]["requests"]["cpu"] == "1"
    assert allocated_cpu(deferred) == "300m"
    assert held(stack, placement.id)["cpu"] == 300
    assert stack.call("snapshot")["nodes"][NODE]["cpu_free"] == filled
    assert rebuilt_node(apiserver, stack)["cpu_free"] == filled
    # the filler gone, the kubelet takes the deferred resize up again, and the ledger follows
    apiserver.kubectl("delete", "pod", "filler", "-n", namespace, "--wait=false")
    apiserver.wait_for(
        lambda: held(stack, placement.id)["cpu"] == 1000, timeout=90, what="the ledger holding 1 CPU"
    )
    assert allocated_cpu(get(apiserver, namespace, "resized")) == "1"
    apiserver.kubectl("delete", "pod", "resized", "-n", namespace, "--wait=false")
