"""gpuledger choosing the devices on a real node: the `runtime-uuids` and `host-indices` visibility modes.

In these modes no device plugin allocates GPUs: the node runs the real kubelet WITHOUT the fake plugin and
advertises `nvidia.com/gpu` as a node agent and an operator would (the device annotation, capacity PATCHed
onto the Node's status; `RealNode.advertise_gpus`), and the webhook writes the devices the ledger chose into
the pod's environment. The shared control plane and the suite's `stack` run it, with the webhook restarted for
this module in `nodeName` binding (no scheduler runs) and each mode in turn, then put back.
"""

from __future__ import annotations

import time

import pytest
import yaml

from devcluster.cluster import ALICE
from devcluster.kubelet import RealNode
from devcluster.nodes import device_entries, device_uuid
from tests.conftest import require_real_node
from tests.e2e.conftest import busybox_pod

pytestmark = [pytest.mark.e2e, pytest.mark.realnode, pytest.mark.ray]

NODE = "real-node-visible"
GPUS = 4
PRODUCT, MEMORY_MIB = "NVIDIA-A100-SXM4-80GB", 81920
PRINT_ENV = "echo CUDA=$CUDA_VISIBLE_DEVICES NV=$NVIDIA_VISIBLE_DEVICES"
HOLD = f"{PRINT_ENV}; trap 'exit 0' TERM; sleep 3600 & wait"


@pytest.fixture(scope="module")
def visible(apiserver, stack):
    """A plugin-less real node advertising GPUS GPUs, known to the suite's ledger; the webhook binding by
    nodeName for the module."""
    require_real_node()
    started = time.monotonic()
    with RealNode(apiserver, name=NODE, index=2) as node:
        node.advertise_gpus(device_entries(NODE, GPUS, PRODUCT, MEMORY_MIB))
        apiserver.wait_for(
            lambda: len((stack.call("snapshot")["nodes"].get(NODE) or {}).get("devices", ())) == GPUS,
            what=f"the ledger knowing {GPUS} GPUs on {NODE}",
        )
        before = stack.reconfigure(binding_mode="both")
        print(f"\nvisibility module: real node advertising {GPUS} GPUs in {time.monotonic() - started:.1f}s")
        try:
            yield node, stack
        finally:
            stack.reconfigure(binding_mode=before.binding_mode, visibility_mode=before.visibility_mode)


def gpu_pod(name: str, command: str, gpus: int) -> str:
    return yaml.safe_dump(busybox_pod(name, command, gpus, host=NODE))


def run(apiserver, namespace: str, name: str, command: str, gpus: int, phases=("Succeeded", "Failed")):
    apiserver.kubectl("create", "-n", namespace, "-f", "-", input=gpu_pod(name, command, gpus), as_user=ALICE)

    def reached():
        pod = apiserver.get_json("pod", name, "-n", namespace)
        return pod if pod["status"].get("phase") in phases else None

    return apiserver.wait_for(reached, timeout=60, what=f"pod {namespace}/{name} {'/'.join(phases)}")


def printed(apiserver, namespace: str, name: str) -> tuple[str, str]:
    out = apiserver.wait_for(
        lambda: apiserver.kubectl("logs", "-n", namespace, name).stdout, what=f"{name}'s output"
    )
    cuda, nv = out.strip().split(" ")
    return cuda.removeprefix("CUDA="), nv.removeprefix("NV=")


def test_runtime_uuids_pods_see_exactly_the_devices_the_ledger_recorded(apiserver, visible, namespace):
    node, stack = visible
    stack.reconfigure(visibility_mode="runtime-uuids")
    first = run(apiserver, namespace, "holds-two", HOLD, gpus=2, phases=("Running",))
    second = run(apiserver, namespace, "holds-one", HOLD, gpus=1, phases=("Running",))
    seen = {}
    for pod, gpus in ((first, 2), (second, 1)):
        name = pod["metadata"]["name"]
        placement = stack.placement(pod)
        assert placement.node == NODE == pod["spec"]["nodeName"] and len(placement.devices) == gpus
        assert placement.uuids == tuple(device_uuid(NODE, d) for d in placement.devices)
        cuda, nv = printed(apiserver, namespace, name)
        assert nv == ",".join(placement.uuids)  # the runtime would mount exactly these
        assert cuda == ",".join(str(i) for i in range(gpus))  # and CUDA numbers them from 0 inside
        seen[name] = set(placement.uuids)
    assert not seen["holds-two"] & seen["holds-one"]
    # no plugin allocated anything: the kubelet admitted the pods against the advertised capacity alone
    held = node.pod_devices()
    assert held[(namespace, "holds-two", "main")] == [] and held[(namespace, "holds-one", "main")] == []


def test_host_indices_pod_sees_the_ledgers_indices(apiserver, visible, namespace):
    _, stack = visible
    stack.reconfigure(visibility_mode="host-indices")
    done = run(apiserver, namespace, "indices", PRINT_ENV, gpus=2)
    assert done["status"]["phase"] == "Succeeded"
    placement = stack.placement(done)
    assert placement.node == NODE and len(placement.devices) == 2
    cuda, nv = printed(apiserver, namespace, "indices")
    assert (cuda, nv) == (",".join(map(str, placement.devices)), "all")
