"""Real pods on a real node: the harness's kubelet (K8S_VERSION) on containerd 2 and runc built from their
Go modules (Debian's containerd where they are not built), the fake GPU device plugin over the kubelet's
device-plugin gRPC API, and PodResources read back over its own gRPC API.

Pods are bound by nodeName in a namespace that is not opted in to admission: this module proves the node, not
gpuledger's placement.
"""

from __future__ import annotations

import sys
import threading
import time
import uuid

import pytest

from devcluster.device_plugin import FakeGPUPlugin, grpc_threads
from devcluster.kubelet import RealNode
from devcluster.nodes import device_uuid
from tests.conftest import require_real_node
from tests.e2e.conftest import busybox_pod

pytestmark = [pytest.mark.e2e, pytest.mark.realnode]

NODE = "real-node-0"
GPUS = 4
PRINT_ENV = "echo CUDA=$CUDA_VISIBLE_DEVICES NV=$NVIDIA_VISIBLE_DEVICES"


@pytest.fixture(scope="module")
def grpc_before():
    """gRPC in this process before the module's node started: what another module may have left."""
    return set(grpc_threads()), "grpc" in sys.modules


@pytest.fixture(scope="module")
def real_node(apiserver, grpc_before):
    """One real node with the fake plugin advertising GPUS devices, for the whole module."""
    require_real_node()
    started = time.monotonic()
    with RealNode(apiserver, name=NODE) as node:
        ready = time.monotonic()
        log = node.kubelet_log.with_name("device-plugin.log")
        with FakeGPUPlugin([device_uuid(NODE, i) for i in range(GPUS)], log=log) as plugin:
            apiserver.wait_for(
                lambda: (
                    apiserver.get_json("node", NODE)["status"].get("allocatable", {}).get("nvidia.com/gpu")
                    == str(GPUS)
                ),
                timeout=30,
                what=f"{GPUS} nvidia.com/gpu allocatable on {NODE}",
            )
            print(
                f"\nreal node: Ready in {ready - started:.1f}s, "
                f"GPUs allocatable {time.monotonic() - ready:.1f}s "
                f"later (logs: {node.kubelet_log}, {node.containerd_log})"
            )
            yield node, plugin


@pytest.fixture
def plain_namespace(apiserver):
    """A namespace gpuledger's admission ignores; deleting it lets the kubelet stop and remove its pods."""
    name = apiserver.create_namespace(f"realnode-{uuid.uuid4().hex[:6]}", admission=False)
    yield name
    apiserver.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


def pod(name: str, command: str, gpus: int = 0) -> dict:
    return busybox_pod(name, command, gpus, node=NODE)


def run_pod(
    apiserver, namespace: str, spec: dict, until=("Succeeded", "Failed"), timeout: float = 60
) -> dict:
    spec = dict(spec, metadata=dict(spec["metadata"], namespace=namespace))
    apiserver.apply(spec)
    name = spec["metadata"]["name"]

    def done():
        obj = apiserver.get_json("pod", name, "-n", namespace)
        return obj if obj["status"].get("phase") in until else None

    return apiserver.wait_for(done, timeout=timeout, what=f"pod {namespace}/{name} {'/'.join(until)}")


def logs(apiserver, namespace: str, name: str) -> str:
    return apiserver.kubectl("logs", "-n", namespace, name).stdout


def test_pod_runs_and_its_output_reaches_kubectl_logs(apiserver, real_node, plain_namespace):
    done = run_pod(apiserver, plain_namespace, pod("print-env", PRINT_ENV))
    assert done["status"]["phase"] == "Succeeded"
    assert logs(apiserver, plain_namespace, "print-env") == "CUDA= NV=\n"


def test_pod_exiting_1_ends_failed(apiserver, real_node, plain_namespace):
    done = run_pod(apiserver, plain_namespace, pod("exit-1", "echo about to fail; exit 1"))
    assert done["status"]["phase"] == "Failed"
    terminated = done["status"]["containerStatuses"][0]["state"]["terminated"]
    assert terminated["exitCode"] == 1
    assert logs(apiserver, plain_namespace, "exit-1") == "about to fail\n"


def test_gpu_pod_sees_the_devices_the_plugin_allocated(apiserver, real_node, plain_namespace):
    _, plugin = real_node
    before = len(plugin.allocations)
    done = run_pod(apiserver, plain_namespace, pod("two-gpus", PRINT_ENV, gpus=2))
    assert done["status"]["phase"] == "Succeeded"
    out = logs(apiserver, plain_namespace, "two-gpus").strip()
    cuda, nv = out.split(" ")
    seen = nv.removeprefix("NV=").split(",")
    assert (
        cuda == "CUDA="
    )  # NVIDIA's plugin sets only NVIDIA_VISIBLE_DEVICES; CUDA indexes what the runtime exposes
    assert len(set(seen)) == 2 and set(seen) <= set(plugin.health), out
    assert plugin.allocations[before:] == [seen]  # exactly what Allocate answered, in its order
    assert plugin.preferred and plugin.preferred[-1]["size"] == 2  # the kubelet asked for a preference first


def test_pod_resources_names_the_devices_a_running_pod_holds(apiserver, real_node, plain_namespace):
    node, plugin = real_node
    command = f"{PRINT_ENV}; trap 'exit 0' TERM; sleep 3600 & wait"
    running = run_pod(apiserver, plain_namespace, pod("holds-one", command, gpus=1), until=("Running",))
    assert running["status"]["phase"] == "Running"
    printed = apiserver.wait_for(
        lambda: logs(apiserver, plain_namespace, "holds-one"), what="the pod's output"
    )
    held = node.pod_devices()  # PodResources List, asked from a child process
    devices = held[(plain_namespace, "holds-one", "main")]
    assert printed.strip() == f"CUDA= NV={devices[0]}" and len(devices) == 1
    assert set(node.allocatable_devices()) == set(plugin.health)


def test_kubelet_restart_reregisters_the_plugin_and_gpus_stay_usable(apiserver, real_node, plain_namespace):
    node, plugin = real_node
    before = plugin.registrations
    node.restart_kubelet()
    apiserver.wait_for(lambda: plugin.registrations > before, timeout=30, what="the plugin registering again")
    done = run_pod(apiserver, plain_namespace, pod("after-restart", PRINT_ENV, gpus=1))
    assert done["status"]["phase"] == "Succeeded"
    assert (
        logs(apiserver, plain_namespace, "after-restart").strip() == f"CUDA= NV={plugin.allocations[-1][0]}"
    )


def test_the_node_and_its_plugin_bring_no_grpc_into_the_test_process(apiserver, real_node, grpc_before):
    """This process forks (Ray's workers, every kubectl): gRPC's threads alive in it can crash the child
    (`Fatal Python error: Segmentation fault` in an at-fork handler). The plugin serves from a process of its
    own and PodResources is read from one, so neither leaves a gRPC thread here."""
    node, plugin = real_node
    threads_before, imported_before = grpc_before
    assert plugin.proc is not None and plugin.proc.poll() is None  # the plugin is its own process
    node.pod_devices()  # a PodResources read, too
    assert set(grpc_threads()) <= threads_before, grpc_threads()
    assert not [t.name for t in threading.enumerate() if "device-plugin" in t.name or "grpc" in t.name]
    if not imported_before:  # another module in this process may have imported it; this one must not
        assert "grpc" not in sys.modules
