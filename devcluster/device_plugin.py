"""A test device plugin: fake `nvidia.com/gpu` devices served to a real kubelet over the device-plugin v1beta1
gRPC API (Register, ListAndWatch, GetPreferredAllocation, Allocate), answering Allocate as NVIDIA's plugin
does.

It sets NVIDIA_VISIBLE_DEVICES to the allocated UUIDs and records what the kubelet asked; it never touches a
GPU.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path

import grpc  # type: ignore[import-untyped]  # no stubs here: types-grpcio is not a dev dependency

from devcluster import kubelet_api
from gpuledger.names import GPU_RESOURCE

API_VERSION = "v1beta1"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
# the kubelet's device manager listens here; the path is a constant of the API, not under --root-dir
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")


class FakeGPUPlugin:
    """Advertises `device_ids` (GPU UUIDs) as `resource`; re-registers when the kubelet restarts.

    `allocations` holds every Allocate answer (a list of UUID lists, one per container) and `preferred` every
    GetPreferredAllocation request, for tests to compare with what the pod saw.
    """

    def __init__(
        self,
        device_ids: Sequence[str],
        resource: str = GPU_RESOURCE,
        socket_dir: Path = DEVICE_PLUGIN_DIR,
        endpoint: str = "gpuledger-fake-gpu.sock",
    ):
        self.api = kubelet_api.load()
        self.resource, self.socket_dir, self.endpoint = resource, Path(socket_dir), endpoint
        self.health = dict.fromkeys(device_ids, HEALTHY)
        self.allocations: list[list[str]] = []
        self.preferred: list[dict] = []
        self.registrations = 0  # one per kubelet (re)start it registered with
        self._changed = threading.Condition()
        self._version = 0
        self._server: grpc.Server | None = None
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def socket(self) -> Path:
        return self.socket_dir / self.endpoint

    # ------------------------------------------------------------------ the DevicePlugin service
    def GetDevicePluginOptions(self, request, context):
        return self.api.deviceplugin.DevicePluginOptions(get_preferred_allocation_available=True)

    def ListAndWatch(self, request, context):
        """The device list now, then again after every health change, until the kubelet or `stop` hangs up."""
        seen = -1
        while context.is_active() and not self._stopping.is_set():
            with self._changed:

                def changed(last: int = seen) -> bool:
                    return self._version != last or self._stopping.is_set()

                self._changed.wait_for(changed, timeout=1.0)
                if self._version == seen:
                    continue
                seen, health = self._version, dict(self.health)
            yield self.api.deviceplugin.ListAndWatchResponse(
                devices=[self.api.deviceplugin.Device(ID=d, health=h) for d, h in health.items()]
            )

    def GetPreferredAllocation(self, request, context):
        """The devices it must include, then the available ones in advertised order (lowest index first)."""
        order = {d: i for i, d in enumerate(self.health)}
        responses = []
        for req in request.container_requests:
            self.preferred.append(
                {
                    "available": list(req.available_deviceIDs),
                    "must_include": list(req.must_include_deviceIDs),
                    "size": req.allocation_size,
                }
            )
            chosen = list(req.must_include_deviceIDs)
            rest = sorted(set(req.available_deviceIDs) - set(chosen), key=lambda d: order.get(d, len(order)))
            chosen += rest[: max(0, req.allocation_size - len(chosen))]
            responses.append(self.api.deviceplugin.ContainerPreferredAllocationResponse(deviceIDs=chosen))
        return self.api.deviceplugin.PreferredAllocationResponse(container_responses=responses)

    def Allocate(self, request, context):
        """NVIDIA's plugin in its default envvar strategy: the container's runtime hook reads this
        variable."""
        responses = []
        for req in request.container_requests:
            unknown = [d for d in req.devices_ids if d not in self.health]
            if unknown:
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"unknown devices {unknown}")
            self.allocations.append(list(req.devices_ids))
            responses.append(
                self.api.deviceplugin.ContainerAllocateResponse(
                    envs={"NVIDIA_VISIBLE_DEVICES": ",".join(req.devices_ids)}
                )
            )
        return self.api.deviceplugin.AllocateResponse(container_responses=responses)

    def PreStartContainer(self, request, context):
        return self.api.deviceplugin.PreStartContainerResponse()

    # ------------------------------------------------------------------ lifecycle
    def set_health(self, device_id: str, healthy: bool) -> None:
        with self._changed:
            self.health[device_id] = HEALTHY if healthy else UNHEALTHY
            self._version += 1
            self._changed.notify_all()

    def start(self, timeout: float = 30.0) -> FakeGPUPlugin:
        self._serve_and_register(timeout)
        self._watcher = threading.Thread(
            target=self._reregister_on_kubelet_restart, daemon=True, name=f"device-plugin-{self.endpoint}"
        )
        self._watcher.start()
        return self

    def stop(self) -> None:
        self._stopping.set()
        with self._changed:
            self._changed.notify_all()
        if self._server is not None:
            self._server.stop(grace=1).wait(5)
            self._server = None
        if self._watcher is not None:
            self._watcher.join(5)
        self.socket.unlink(missing_ok=True)

    def __enter__(self) -> FakeGPUPlugin:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def _serve_and_register(self, timeout: float) -> None:
        if self._server is not None:
            self._server.stop(grace=0).wait(5)
        self.socket.unlink(missing_ok=True)
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=8))
        self.api.deviceplugin_grpc.add_DevicePluginServicer_to_server(self, server)
        server.add_insecure_port(f"unix://{self.socket}")
        server.start()
        self._server = server
        kubelet_socket = self.socket_dir / "kubelet.sock"
        with grpc.insecure_channel(f"unix://{kubelet_socket}") as channel:
            try:
                grpc.channel_ready_future(channel).result(timeout=timeout)
            except grpc.FutureTimeoutError:
                raise TimeoutError(
                    f"no kubelet device-plugin registration socket at {kubelet_socket}"
                ) from None
            self.api.deviceplugin_grpc.RegistrationStub(channel).Register(
                self.api.deviceplugin.RegisterRequest(
                    version=API_VERSION,
                    endpoint=self.endpoint,
                    resource_name=self.resource,
                    options=self.api.deviceplugin.DevicePluginOptions(
                        get_preferred_allocation_available=True
                    ),
                ),
                timeout=timeout,
            )
        self.registrations += 1

    def _reregister_on_kubelet_restart(self) -> None:
        """A restarting kubelet empties the socket folder; like NVIDIA's plugin, serve and register again."""
        while not self._stopping.wait(0.5):
            if not self.socket.exists() and (self.socket_dir / "kubelet.sock").exists():
                time.sleep(0.5)  # let the new kubelet's registration server come up
                if not self._stopping.is_set():
                    try:
                        self._serve_and_register(timeout=30)
                    except (grpc.RpcError, TimeoutError):
                        continue
