"""The node agent on a real node: it reads the real kubelet's PodResources socket and publishes
`agentaflow.gpu/device-holders` naming the pod on exactly the devices the device plugin gave it.

The harness's kubelet + containerd + runc (devcluster/kubelet.py) with the fake GPU plugin; the agent runs as
its own process (`python -m gpuledger.node_agent`) with the fake probe reporting the plugin's UUIDs, and GPU
processes whose pids are real: this test's own (outside Kubernetes) and the pod's (inside it), so the /proc
cgroup mapping is checked against the cgroups a real kubelet made. The pod's namespace is not opted in to
admission.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path

import pytest

from devcluster.agent_process import AgentProcess
from devcluster.device_plugin import FakeGPUPlugin
from devcluster.kubelet import RealNode
from devcluster.nodes import device_uuid
from gpuledger.names import HOLDERS_ANNOTATION
from tests.conftest import require_real_node
from tests.e2e.conftest import busybox_pod

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]

NODE = "real-node-agent"
GPUS = 4
HOST_PROCESS_MIB = 300  # GPU memory the fake probe says this test's own process holds on device 3


@pytest.fixture(scope="module")
def real_node(apiserver):
    """One real node with the fake plugin advertising GPUS devices, for the whole module."""
    require_real_node()
    started = time.monotonic()
    with (
        RealNode(apiserver, name=NODE) as node,
        FakeGPUPlugin([device_uuid(NODE, i) for i in range(GPUS)]) as plugin,
    ):
        apiserver.wait_for(
            lambda: (
                apiserver.get_json("node", NODE)["status"].get("allocatable", {}).get("nvidia.com/gpu")
                == str(GPUS)
            ),
            timeout=30,
            what=f"{GPUS} nvidia.com/gpu allocatable on {NODE}",
        )
        print(f"\nreal node {NODE}: GPUs allocatable {time.monotonic() - started:.1f}s after start")
        yield node, plugin


@pytest.fixture
def plain_namespace(apiserver):
    name = apiserver.create_namespace(f"realagent-{uuid.uuid4().hex[:6]}", admission=False)
    yield name
    apiserver.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def annotation(apiserver) -> str | None:
    return apiserver.get_json("node", NODE)["metadata"].get("annotations", {}).get(HOLDERS_ANNOTATION)


def wait_holders(
    apiserver, agent: AgentProcess, predicate, what: str, timeout: float = 30
) -> tuple[dict, str]:
    def seen():
        agent.check_alive()
        text = annotation(apiserver)
        return (json.loads(text), text) if text and predicate(json.loads(text)) else None

    return apiserver.wait_for(seen, timeout=timeout, interval=0.1, what=what)


def pod_pids(pod_uid: str) -> list[int]:
    """The host pids whose cgroup is the pod's (found independently of the agent's parser)."""
    marks = (f"pod{pod_uid}", f"pod{pod_uid.replace('-', '_')}")
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                text = (entry / "cgroup").read_text()
            except OSError:
                continue
            if any(m in text for m in marks):
                pids.append(int(entry.name))
    return pids


def test_agent_names_the_pod_on_its_devices_and_a_restart_loses_nothing(
    apiserver, real_node, plain_namespace
):
    node, plugin = real_node
    started = time.monotonic()
    me = os.getpid()  # a process outside Kubernetes: the fake probe says it holds memory on device 3
    agent = AgentProcess(apiserver.kubeconfig, node, GPUS, [[3, me, HOST_PROCESS_MIB]]).start()
    try:
        external = {"3": {"memoryMiB": HOST_PROCESS_MIB, "pids": [me]}}
        wait_holders(
            apiserver,
            agent,
            lambda a: a["source"] == "podresources" and a["holders"] == {} and a["external"] == external,
            "the agent's first device-holders annotation: nothing held",
        )
        first_publish = time.monotonic() - started

        command = "echo NV=$NVIDIA_VISIBLE_DEVICES; trap 'exit 0' TERM; sleep 3600 & wait"
        pod = busybox_pod("holds-two", command, 2, node=NODE, namespace=plain_namespace)
        apiserver.apply(pod)
        running = apiserver.wait_for(
            lambda: (lambda p: p if p["status"].get("phase") == "Running" else None)(
                apiserver.get_json("pod", "holds-two", "-n", plain_namespace)
            ),
            timeout=60,
            what="pod holds-two Running",
        )
        seen_running = time.monotonic()
        held, text = wait_holders(
            apiserver, agent, lambda a: bool(a["holders"]), "the annotation naming the pod", timeout=30
        )
        to_annotation = time.monotonic() - seen_running
        printed = apiserver.wait_for(
            lambda: apiserver.kubectl("logs", "-n", plain_namespace, "holds-two").stdout,
            what="the pod's output",
        )
        visible = printed.strip().removeprefix("NV=").split(",")
        assert len(visible) == 2 and plugin.allocations[-1] == visible
        who = [{"namespace": plain_namespace, "pod": "holds-two", "container": "main"}]
        uuids = [device_uuid(NODE, i) for i in range(GPUS)]
        assert held == {
            "v": 1,
            "source": "podresources",
            "holders": {str(uuids.index(u)): who for u in visible},
            "external": external,
            "unmapped": [],
        }

        # a fresh agent, told that the pod's own process holds memory too: recomputes the same text, and
        # the pod's process is not external (its cgroup, made by the real kubelet, names the pod)
        pids = pod_pids(running["metadata"]["uid"])
        assert pids, "no process in the pod's cgroup"
        pod_device = uuids.index(visible[0])
        agent.stop()
        apiserver.kubectl("annotate", "node", NODE, f"{HOLDERS_ANNOTATION}-")
        assert annotation(apiserver) is None
        agent.restart([[3, me, HOST_PROCESS_MIB], *([pod_device, pid, 1000] for pid in pids)])
        restarted, again = wait_holders(apiserver, agent, lambda a: True, "the restarted agent's annotation")
        assert again == text

        apiserver.kubectl("delete", "pod", "holds-two", "-n", plain_namespace, "--wait=false")
        deleted = time.monotonic()
        wait_holders(apiserver, agent, lambda a: a["holders"] == {}, "the holders emptied", timeout=60)
        to_empty = time.monotonic() - deleted
        empty = annotation(apiserver)
        assert json.loads(empty or "{}") == {**held, "holders": {}}

        agent.stop()
        apiserver.kubectl("annotate", "node", NODE, f"{HOLDERS_ANNOTATION}-")
        agent.restart([[3, me, HOST_PROCESS_MIB]])
        assert (
            wait_holders(apiserver, agent, lambda a: True, "the annotation after a second restart")[1]
            == empty
        )
        print(
            f"\nnode agent: first annotation {first_publish:.1f}s after start; pod Running -> annotated "
            f"{to_annotation:.2f}s; pod deleted -> holders empty {to_empty:.2f}s (holders polled every 0.5s)"
        )
    finally:
        agent.stop()
