"""Which pod and container hold which GPU, from the kubelet's PodResources API (v1) on its unix socket.

The kubelet is the one that handed the devices out (through the device plugin's Allocate), so its answer is
the truth the ledger compares its reservations with. The client returns plain dataclasses; `map_holders`
turns them and the probe's reports into the `agentaflow.gpu/device-holders` parts, and is pure.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass
from pathlib import Path

from gpuledger.names import GPU_RESOURCE
from gpuledger.node_agent.probes import DeviceReport

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
DEFAULT_RESOURCES = (GPU_RESOURCE,)


@dataclass(frozen=True)
class Holding:
    """One container's devices of one resource, as the kubelet lists them."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_ids: tuple[str, ...]


class PodResourcesUnavailable(RuntimeError):
    """The socket is missing, or the kubelet did not answer in time."""


class PodResourcesClient:
    """List() and GetAllocatableResources() over `socket`; a channel per call, so nothing outlives it."""

    def __init__(self, socket: Path = DEFAULT_SOCKET, timeout_s: float = 5.0):
        self.socket, self.timeout_s = Path(socket), timeout_s

    def list(self) -> list[Holding]:
        listed = self._call("List", "ListPodResourcesRequest")
        return [
            Holding(pod.namespace, pod.name, container.name, dev.resource_name, tuple(dev.device_ids))
            for pod in listed.pod_resources
            for container in pod.containers
            for dev in container.devices
            if dev.device_ids
        ]

    def allocatable(self) -> dict[str, tuple[str, ...]]:
        """resource name -> every device id the kubelet may hand out (from every registered plugin)."""
        answer = self._call("GetAllocatableResources", "AllocatableResourcesRequest")
        ids: dict[str, list[str]] = {}
        for dev in answer.devices:
            ids.setdefault(dev.resource_name, []).extend(dev.device_ids)
        return {name: tuple(found) for name, found in ids.items()}

    def _call(self, method: str, request: str):
        import grpc  # type: ignore[import-untyped]  # no stubs here: types-grpcio is not a dependency

        from gpuledger.node_agent import kubelet_grpc

        if not self.socket.exists():
            raise PodResourcesUnavailable(f"no kubelet PodResources socket at {self.socket}")
        api = kubelet_grpc.load()
        with grpc.insecure_channel(f"unix://{self.socket}") as channel:
            stub = api.podresources_grpc.PodResourcesListerStub(channel)
            try:
                return getattr(stub, method)(getattr(api.podresources, request)(), timeout=self.timeout_s)
            except grpc.RpcError as err:
                raise PodResourcesUnavailable(
                    f"PodResources {method} on {self.socket}: {err.code().name} {err.details()}"
                ) from err


def device_index(device_id: str, reports: Iterable[DeviceReport]) -> int | None:
    """The probed device a kubelet device id names: its UUID (NVIDIA's plugin), a time-sliced replica of it
    (`<uuid>::<n>`), or its index (the plugin's `--device-id-strategy=index`)."""
    base = device_id.split("::", 1)[0]
    for report in reports:
        if report.uuid == base or (base.isdigit() and int(base) == report.index):
            return report.index
    return None


def map_holders(
    holdings: Iterable[Holding],
    reports: list[DeviceReport],
    resources: Collection[str] = DEFAULT_RESOURCES,
    allocatable: dict[str, tuple[str, ...]] | None = None,
) -> tuple[dict[str, list[dict]], list[str]]:
    """(device index as text -> sorted unique holders, sorted ids no probed device has) for `resources`.

    `allocatable` ids count towards the unmapped ones too: a plugin whose ids the probe cannot match shows
    before any pod holds a device.
    """
    holders: dict[str, set[tuple[str, str, str]]] = {}
    unmapped: set[str] = set()
    for holding in holdings:
        if holding.resource not in resources:
            continue
        for device_id in holding.device_ids:
            index = device_index(device_id, reports)
            if index is None:
                unmapped.add(device_id)
            else:
                holders.setdefault(str(index), set()).add((holding.namespace, holding.pod, holding.container))
    for resource, ids in (allocatable or {}).items():
        if resource in resources:
            unmapped.update(d for d in ids if device_index(d, reports) is None)
    return (
        {
            index: [{"namespace": ns, "pod": pod, "container": c} for ns, pod, c in sorted(held)]
            for index, held in sorted(holders.items(), key=lambda item: int(item[0]))
        },
        sorted(unmapped),
    )
