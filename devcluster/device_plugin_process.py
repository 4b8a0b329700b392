"""The fake device plugin's gRPC server, a process of its own: `python -m devcluster.device_plugin_process`.

`devcluster.device_plugin.FakeGPUPlugin` starts it and talks to it over its stdin and stdout, one JSON object
a line each way. gRPC lives only here: a process that forks (Ray starting its workers, every `kubectl` a test
runs) while gRPC's threads are alive in it can crash in the child, so the test process never imports grpc.

Requests: `{"op": "state"}`, `{"op": "set_health", "device": ID, "healthy": BOOL}`, `{"op": "stop"}`. Each
gets one reply, `{"ok": true, "state": STATE}` or `{"ok": false, "error": TEXT, "type": NAME}`, and the first
reply, unasked, says whether serving and registering with the kubelet worked. STATE is the plugin's record:
`health` (device -> Healthy/Unhealthy, in advertised order), `allocations` (every Allocate answer, one UUID
list per container), `preferred` (every GetPreferredAllocation request) and `registrations`. End of input
stops it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Sequence
from concurrent import futures
from pathlib import Path
from typing import IO

import grpc  # type: ignore[import-untyped]  # no stubs here: types-grpcio is not a dev dependency

from devcluster import kubelet_api
from devcluster.device_plugin import API_VERSION, DEVICE_PLUGIN_DIR, HEALTHY, UNHEALTHY
from gpuledger.names import GPU_RESOURCE


class DevicePluginServer:
    """Advertises `device_ids` (GPU UUIDs) as `resource`; re-registers when the kubelet restarts, as NVIDIA's
    plugin does, and answers Allocate as it does: NVIDIA_VISIBLE_DEVICES set to the allocated UUIDs."""

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
        self._changed = threading.Condition()  # guards everything above; notified on health changes
        self._version = 0
        self._server: grpc.Server | None = None
        self._stopping = threading.Event()
        self._watcher: threading.Thread | None = None

    @property
    def socket(self) -> Path:
        return self.socket_dir / self.endpoint

    def state(self) -> dict:
        with self._changed:
            return {
                "health": dict(self.health),
                "allocations": [list(a) for a in self.allocations],
                "preferred": [dict(p) for p in self.preferred],
                "registrations": self.registrations,
            }

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
            with self._changed:
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
            with self._changed:
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
            if device_id not in self.health:
                raise KeyError(f"no device {device_id!r}: the plugin advertises {list(self.health)}")
            self.health[device_id] = HEALTHY if healthy else UNHEALTHY
            self._version += 1
            self._changed.notify_all()

    def start(self, timeout: float = 30.0) -> DevicePluginServer:
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
        if self._watcher is not None:
            self._watcher.join(5)
        if self._server is not None:
            self._server.stop(grace=1).wait(5)
            self._server = None
        self.socket.unlink(missing_ok=True)

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
        with self._changed:
            self.registrations += 1

    def _reregister_on_kubelet_restart(self) -> None:
        """A restarting kubelet empties the socket folder; like NVIDIA's plugin, serve and register again."""
        while not self._stopping.wait(0.5):
            if not self.socket.exists() and (self.socket_dir / "kubelet.sock").exists():
                time.sleep(0.5)  # let the new kubelet's registration server come up
                if not self._stopping.is_set():
                    try:
                        self._serve_and_register(timeout=30)
                    except (grpc.RpcError, TimeoutError) as err:
                        print(f"registering again failed, retrying: {err}", file=sys.stderr, flush=True)
                        continue
                    print(f"registered again with the kubelet at {time.ctime()}", file=sys.stderr, flush=True)


def _reply(out: IO[str], ok: bool, state: dict | None = None, error: BaseException | None = None) -> None:
    message: dict = {"ok": ok}
    if state is not None:
        message["state"] = state
    if error is not None:
        message["error"], message["type"] = str(error), type(error).__name__
    out.write(json.dumps(message) + "\n")
    out.flush()


def serve(plugin: DevicePluginServer, timeout: float, requests: IO[str], out: IO[str]) -> int:
    """Start `plugin`, say so on `out`, answer `requests` until `stop` or their end; the exit code."""
    try:
        plugin.start(timeout)
    except (grpc.RpcError, TimeoutError, OSError) as err:  # the reason goes to the starter, which raises it
        _reply(out, False, error=err)
        plugin.stop()
        return 1
    _reply(out, True, plugin.state())
    try:
        for line in requests:
            if not line.strip():
                continue
            try:
                request = json.loads(line)
                op = request["op"]
                if op == "stop":
                    break
                if op == "set_health":
                    plugin.set_health(request["device"], bool(request["healthy"]))
                elif op != "state":
                    raise ValueError(f"unknown request {op!r}")
            except (ValueError, KeyError, TypeError) as err:  # a bad request is answered, never fatal
                _reply(out, False, error=err)
                continue
            _reply(out, True, plugin.state())
    finally:
        plugin.stop()
    _reply(out, True, plugin.state())
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m devcluster.device_plugin_process", description=__doc__)
    parser.add_argument("--devices", required=True, help="a JSON list of the device ids to advertise")
    parser.add_argument("--resource", default=GPU_RESOURCE)
    parser.add_argument("--socket-dir", type=Path, default=DEVICE_PLUGIN_DIR)
    parser.add_argument("--endpoint", default="gpuledger-fake-gpu.sock")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds to wait for the kubelet")
    args = parser.parse_args(argv)
    # replies go to the descriptor stdout was; anything else printing to stdout lands on stderr (the log)
    out = os.fdopen(os.dup(sys.stdout.fileno()), "w", encoding="utf-8")
    sys.stdout.flush()
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    plugin = DevicePluginServer(json.loads(args.devices), args.resource, args.socket_dir, args.endpoint)
    return serve(plugin, args.timeout, sys.stdin, out)


if __name__ == "__main__":
    sys.exit(main())
