"""A pod that waited for GPUs, on the real kubelet: it sees exactly the devices the ledger recorded.

A waiting pod's environment is written at admission, before anything is placed: its device variables come
from the downward API (`valueFrom.fieldRef` on annotations the placement adapter writes with the placement),
which the kubelet resolves when the container starts, after the gate is removed. Here a plugin-less real node
advertises 4 GPUs (as tests/e2e/test_real_node_visibility.py does), a pod holds all of them, a second pod
asking for 2 waits gated, and when the first is deleted the second is placed, bound by kube-scheduler, run by
the kubelet, and prints what it was given: the ledger's devices, in each visibility mode that writes them.
"""

from __future__ import annotations

import time

import pytest
import yaml

from devcluster.cluster import ALICE
from devcluster.kubelet import RealNode
from devcluster.nodes import device_entries
from devcluster.scheduler import KubeScheduler
from gpuledger.names import SCHEDULING_GATE
from tests.conftest import require_real_node
from tests.e2e.conftest import busybox_pod

pytestmark = [pytest.mark.e2e, pytest.mark.realnode, pytest.mark.ray]

NODE = "real-node-waiting"
GPUS = 4
PRODUCT, MEMORY_MIB = "NVIDIA-A100-SXM4-80GB", 81920
PRINT_ENV = "echo CUDA=$CUDA_VISIBLE_DEVICES NV=$NVIDIA_VISIBLE_DEVICES"
HOLD = "trap 'exit 0' TERM; sleep 3600 & wait"


@pytest.fixture(scope="module")
def node(apiserver, stack):
    """A plugin-less real node advertising GPUS GPUs, kube-scheduler, and the webhook at the product's
    default (a pod that does not fit waits) for the module."""
    require_real_node()
    with RealNode(apiserver, name=NODE, index=3) as real, KubeScheduler(apiserver):
        real.advertise_gpus(device_entries(NODE, GPUS, PRODUCT, MEMORY_MIB))
        apiserver.wait_for(
            lambda: len((stack.call("snapshot")["nodes"].get(NODE) or {}).get("devices", ())) == GPUS,
            what=f"the ledger knowing {GPUS} GPUs on {NODE}",
        )
        before = stack.reconfigure(when_full="wait")
        try:
            yield stack
        finally:
            stack.reconfigure(when_full=before.when_full, visibility_mode=before.visibility_mode)


def create(apiserver, namespace: str, name: str, command: str, gpus: int) -> None:
    pod = busybox_pod(name, command, gpus, host=NODE)
    apiserver.kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(pod), as_user=ALICE)


def pod(apiserver, namespace: str, name: str) -> dict:
    return apiserver.get_json("pod", name, "-n", namespace)


def printed(apiserver, namespace: str, name: str) -> tuple[str, str]:
    out = apiserver.wait_for(
        lambda: apiserver.kubectl("logs", "-n", namespace, name, check=False).stdout, what=f"{name}'s output"
    )
    cuda, nv = out.strip().split(" ")
    return cuda.removeprefix("CUDA="), nv.removeprefix("NV=")


@pytest.mark.parametrize("mode", ["runtime-uuids", "host-indices"])
def test_a_pod_placed_after_waiting_prints_the_devices_the_ledger_recorded(apiserver, node, namespace, mode):
    stack = node
    stack.reconfigure(visibility_mode=mode)
    create(apiserver, namespace, "holder", HOLD, GPUS)
    apiserver.wait_for(
        lambda: pod(apiserver, namespace, "holder")["status"].get("phase") == "Running",
        what="the holder running",
    )
    create(apiserver, namespace, "waiter", PRINT_ENV, 2)
    waiting = pod(apiserver, namespace, "waiter")
    assert {"name": SCHEDULING_GATE} in waiting["spec"]["schedulingGates"]
    assert stack.placement(waiting) is None
    started = time.monotonic()
    apiserver.kubectl("delete", "pod", "holder", "-n", namespace, "--wait=false")

    def done():
        p = pod(apiserver, namespace, "waiter")
        return p if p["status"].get("phase") in ("Succeeded", "Failed") else None

    finished = apiserver.wait_for(done, timeout=120, what="the waiter run by the kubelet")
    print(f"\n{mode}: the waiting pod ran {time.monotonic() - started:.1f}s after the holder was deleted")
    assert finished["status"]["phase"] == "Succeeded" and finished["spec"]["nodeName"] == NODE
    placement = stack.placement(finished)
    assert placement is not None and placement.node == NODE and len(placement.devices) == 2
    cuda, nv = printed(apiserver, namespace, "waiter")
    if mode == "runtime-uuids":
        assert nv == ",".join(placement.uuids)  # the runtime would mount exactly these
        assert cuda == "0,1"
    else:
        assert (cuda, nv) == (",".join(map(str, placement.devices)), "all")
