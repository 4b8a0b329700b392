"""What a real node's kubelet says about GPUs: the devices it assigned each container (PodResources `List`),
and GPUs published the way a node without a device plugin does, through the real node agent.

It reads the kubelet and runs the agent once; it never starts, stops or reconfigures the kubelet. PodResources
is read by a child process (`python -m devcluster.node_gpus list|allocatable SOCKET RESOURCE` prints JSON), so
the caller never imports grpc.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from devcluster.kubeclient import KubeClient
from gpuledger.names import GPU_RESOURCE

REPO = Path(__file__).resolve().parents[1]


def pod_devices(socket: Path, resource: str = GPU_RESOURCE) -> dict[tuple[str, str, str], list[str]]:
    """(namespace, pod, container) -> the `resource` device ids the kubelet assigned, from PodResources
    `List` (the kubelet's own record of running pods; terminated pods are not listed)."""
    listed = _pod_resources("list", socket, resource)
    return {(ns, pod, container): list(devices) for ns, pod, container, devices in listed}


def allocatable_devices(socket: Path, resource: str = GPU_RESOURCE) -> list[str]:
    """The `resource` device ids the kubelet can assign, from PodResources `GetAllocatableResources`."""
    return list(_pod_resources("allocatable", socket, resource))


def _pod_resources(what: str, socket: Path, resource: str) -> list:
    """Ask PodResources in a child process (`python -m devcluster.node_gpus`): gRPC's threads must never live
    in the test process, which forks (Ray, every `kubectl`)."""
    argv = [sys.executable, "-m", "devcluster.node_gpus", what, str(socket), resource]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, env=_env(), cwd=REPO)
    if proc.returncode != 0:
        raise RuntimeError(
            f"PodResources {what} at {socket} failed ({proc.returncode}): {proc.stderr[-2000:]}"
        )
    return json.loads(proc.stdout)


def _ask_pod_resources(what: str, socket: Path, resource: str) -> list:
    """The gRPC calls themselves: run only by `main`, in the child process."""
    import grpc  # type: ignore[import-untyped]  # no stubs here: types-grpcio is not a dev dependency

    from devcluster import kubelet_api

    api = kubelet_api.load()
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        stub = api.podresources_grpc.PodResourcesListerStub(channel)
        if what == "allocatable":
            answer = stub.GetAllocatableResources(api.podresources.AllocatableResourcesRequest(), timeout=10)
            return [d for dev in answer.devices if dev.resource_name == resource for d in dev.device_ids]
        listed = stub.List(api.podresources.ListPodResourcesRequest(), timeout=10)
    return [
        [
            p.namespace,
            p.name,
            c.name,
            [d for dev in c.devices if dev.resource_name == resource for d in dev.device_ids],
        ]
        for p in listed.pod_resources
        for c in p.containers
    ]


def _env() -> dict[str, str]:
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path}


def advertise_gpus(
    cp: KubeClient,
    node_name: str,
    socket: Path,
    devices: list[dict],
    resource: str = GPU_RESOURCE,
    timeout: float = 30,
) -> dict:
    """Publish GPUs the way a node without a device plugin does (visibility modes `runtime-uuids`,
    `host-indices`): the real node agent (`python -m gpuledger.node_agent --once --advertise-capacity`,
    its fake probe reporting `devices`, as `devcluster.nodes.device_entries` makes them) writes the
    `agentaflow.gpu/devices` annotation and PATCHes `resource` capacity onto the Node's status. Returns
    the Node once the kubelet, which derives allocatable from capacity, reports the count allocatable."""
    count = str(sum(bool(d.get("healthy", True)) for d in devices))
    fake = [
        {
            "index": d["index"],
            "uuid": d["uuid"],
            "product": d["product"],
            "memory_mib": d["memoryMiB"],
            "healthy": d.get("healthy", True),
            "reason": d.get("reason", ""),
        }
        for d in devices
    ]
    argv = [
        sys.executable, "-m", "gpuledger.node_agent", "--node", node_name, "--once",
        "--kubeconfig", str(cp.kubeconfig), "--fake", json.dumps(fake),
        "--pod-resources-socket", str(socket), "--advertise-capacity", resource,
    ]  # fmt: skip
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=120, env=_env())
    if proc.returncode != 0:
        output = proc.stdout[-2000:] + proc.stderr[-2000:]
        raise RuntimeError(f"the node agent exited {proc.returncode}: {output}")

    def allocatable():
        node = cp.get_json("node", node_name)
        return node if node["status"].get("allocatable", {}).get(resource) == count else None

    return cp.wait_for(
        allocatable, timeout=timeout, what=f"the kubelet reporting {count} {resource} allocatable"
    )


def main(argv: list[str] | None = None) -> int:
    what, socket, resource = argv if argv is not None else sys.argv[1:]
    if what not in ("list", "allocatable"):
        raise SystemExit(
            f"usage: python -m devcluster.node_gpus list|allocatable SOCKET RESOURCE (not {what!r})"
        )
    print(json.dumps(_ask_pod_resources(what, Path(socket), resource)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
