"""The node's word on who holds each device, through the real API server: the node agent's
agentaflow.gpu/device-holders annotation (patched here with kubectl, as the agent would) makes the ledger
(a) keep new pods off a device a foreign pod holds, (b) record the devices the kubelet gave its own pod,
count it and post an Event, and (c) deny a pod where only GPUs busy outside Kubernetes are left, saying why.
A rebuilt ledger agrees with the live one."""

from __future__ import annotations

import json

import pytest

from tests.e2e.conftest import gpu_pod_yaml

pytestmark = pytest.mark.e2e

NODE = "leaf-1-node-2"  # 8 GPUs, untainted; its devices come from allocatable nvidia.com/gpu
HOLDERS = "agentaflow.gpu/device-holders"
ON_NODE = {"nodeSelector": {"kubernetes.io/hostname": NODE}}


def annotate(apiserver, holders: dict[int, str], external: dict[int, int] | None = None) -> None:
    value = {
        "v": 1,
        "source": "podresources",
        "holders": {
            str(d): [{"namespace": k.split("/")[0], "pod": k.split("/")[1], "container": "cuda"}]
            for d, k in holders.items()
        },
        "external": {str(d): {"memoryMiB": mib, "pids": [4000 + d]} for d, mib in (external or {}).items()},
        "unmapped": [],
    }
    apiserver.kubectl("annotate", "node", NODE, "--overwrite", f"{HOLDERS}={json.dumps(value)}")


def device_owners(stack) -> list:
    return [d[3] for d in stack.call("snapshot")["nodes"][NODE]["devices"]]


@pytest.fixture
def truth_node(apiserver, stack):
    yield NODE
    apiserver.kubectl("annotate", "node", NODE, f"{HOLDERS}-", check=False)
    apiserver.wait_for(
        lambda: "truth" not in stack.call("snapshot")["nodes"][NODE], timeout=30, what="cleared"
    )


def test_the_ledger_takes_the_nodes_word_on_who_holds_each_device(apiserver, stack, workloads, truth_node):
    ns = workloads.namespace
    # (a) a pod the ledger does not own (another namespace, the stock plugin's) holds device 0
    annotate(apiserver, {0: "other/foreign"})
    apiserver.wait_for(lambda: device_owners(stack)[0] == f"truth:{NODE}", timeout=30, what="device 0 taken")
    workloads.apply(gpu_pod_yaml("mine", gpus=1, spec=ON_NODE))
    mine = workloads.pod("mine")
    placed = workloads.placement(mine)
    assert placed.node == NODE and 0 not in placed.devices
    workloads.wait_confirmed([mine])

    # (b) the kubelet gave the ledger's own pod device 5, not the one the ledger chose
    assert placed.devices != (5,)
    annotate(apiserver, {0: "other/foreign", 5: f"{ns}/mine"})

    def corrected():
        held = stack.call("lookup", [placed.id])[0]
        return held is not None and held.placement.devices == (5,)

    apiserver.wait_for(corrected, timeout=30, what="the ledger records device 5 for its pod")
    owners = device_owners(stack)
    assert owners[5] == placed.id and owners[placed.devices[0]] is None
    stats = stack.call("stats")
    assert stats.device_corrections >= 1
    corrections = [c for c in stack.call("status")["device_corrections"] if c[0] == f"{ns}/mine"]
    assert corrections == [[f"{ns}/mine", placed.id, NODE, list(placed.devices), [5]]]

    def corrected_event():
        events = apiserver.get_json("events", "-n", ns)["items"]
        return [
            e
            for e in events
            if e.get("reason") == "GPUDevicesCorrected" and e["involvedObject"].get("name") == "mine"
        ]

    (event,) = apiserver.wait_for(corrected_event, timeout=30, what="a GPUDevicesCorrected Event on the pod")
    assert "[5]" in event["message"] and HOLDERS in event["message"]
    # the device the ledger had guessed is free again: a pod asking for it gets it
    workloads.apply(gpu_pod_yaml("next", gpus=1, spec=ON_NODE))
    nxt = workloads.placement("next")
    assert nxt.node == NODE and not {0, 5} & set(nxt.devices)

    # (c) processes outside Kubernetes fill every other device: a denial that says so
    busy = {d: 2048 for d in range(8) if d not in (0, 5, *nxt.devices)}
    annotate(apiserver, {0: "other/foreign", 5: f"{ns}/mine"}, external=busy)
    apiserver.wait_for(
        lambda: stack.call("snapshot")["nodes"][NODE].get("truth", {}).get("external"),
        timeout=30,
        what="external",
    )
    denied = workloads.apply(gpu_pod_yaml("denied", gpus=1, spec=ON_NODE), check=False)
    assert denied.returncode != 0
    words = denied.stderr
    first = min(busy)
    for text in (
        NODE,
        f"device {first} has 2048 MiB",
        "outside Kubernetes",
        "external_memory_threshold_mib 1024",
    ):
        assert text in words, words

    # a rebuilt ledger takes the same word from the same Node: what this node holds is unchanged
    workloads.wait_confirmed([workloads.pod("next")])
    before = stack.call("snapshot")["nodes"][NODE]
    incarnation = stack.kill_ledger()
    stack.wait_ledger_synced(after_incarnation=incarnation)
    after = stack.call("snapshot")["nodes"][NODE]
    assert after == before
    assert stack.call("lookup", [placed.id])[0].placement.devices == (5,)
