"""A test device plugin: fake `nvidia.com/gpu` devices served to a real kubelet over the device-plugin v1beta1
gRPC API (Register, ListAndWatch, GetPreferredAllocation, Allocate), answering Allocate as NVIDIA's plugin
does.

It sets NVIDIA_VISIBLE_DEVICES to the allocated UUIDs and records what the kubelet asked; it never touches a
GPU. The gRPC server runs in a process of its own (device_plugin_process.py): this module never imports grpc,
so the test process holds no gRPC threads when it forks (Ray's workers, every `kubectl`).
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from devcluster.processes import stop_process
from gpuledger.names import GPU_RESOURCE

API_VERSION = "v1beta1"
HEALTHY, UNHEALTHY = "Healthy", "Unhealthy"
# the kubelet's device manager listens here; the path is a constant of the API, not under --root-dir
DEVICE_PLUGIN_DIR = Path("/var/lib/kubelet/device-plugins")
REPO = Path(__file__).resolve().parents[1]


# the names gRPC's core gives the threads it starts (the OS's 15-character names, /proc/self/task/*/comm)
GRPC_THREAD_PREFIXES = ("grpc", "event_engine", "lifeguard", "default-executo", "resolver-execut")


def grpc_threads() -> list[str]:
    """The threads of this process that gRPC's core started (alive until the process ends, once it served or
    dialled); none in a process that only ran this harness's real node."""
    names = []
    for task in Path("/proc/self/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
        except OSError:  # the thread ended meanwhile
            continue
        if name.startswith(GRPC_THREAD_PREFIXES):
            names.append(name)
    return sorted(names)


class DevicePluginError(RuntimeError):
    """The plugin's process failed, or refused a request."""


class FakeGPUPlugin:
    """Advertises `device_ids` (GPU UUIDs) as `resource`; re-registers when the kubelet restarts.

    `allocations` holds every Allocate answer (a list of UUID lists, one per container), `preferred` every
    GetPreferredAllocation request, `health` each device's health and `registrations` how many times it
    registered with a kubelet: each read asks the plugin's process; after `stop`, they hold its last record.
    Its output goes to `log` (a temporary file unless given).
    """

    def __init__(
        self,
        device_ids: Sequence[str],
        resource: str = GPU_RESOURCE,
        socket_dir: Path = DEVICE_PLUGIN_DIR,
        endpoint: str = "gpuledger-fake-gpu.sock",
        log: Path | None = None,
    ):
        self.device_ids = list(device_ids)
        self.resource, self.socket_dir, self.endpoint = resource, Path(socket_dir), endpoint
        self.log = Path(log) if log is not None else None
        self.proc: subprocess.Popen | None = None
        self._lock = threading.Lock()  # one request and its reply at a time
        self._last: dict = {
            "health": dict.fromkeys(self.device_ids, HEALTHY),
            "allocations": [],
            "preferred": [],
            "registrations": 0,
        }

    @property
    def socket(self) -> Path:
        return self.socket_dir / self.endpoint

    # ------------------------------------------------------------------ what it recorded
    @property
    def health(self) -> dict[str, str]:
        return dict(self._state()["health"])

    @property
    def allocations(self) -> list[list[str]]:
        return [list(a) for a in self._state()["allocations"]]

    @property
    def preferred(self) -> list[dict]:
        return [dict(p) for p in self._state()["preferred"]]

    @property
    def registrations(self) -> int:
        return int(self._state()["registrations"])

    def set_health(self, device_id: str, healthy: bool) -> None:
        """Mark a device (un)healthy; the kubelet's ListAndWatch stream gets the new list."""
        self._request({"op": "set_health", "device": device_id, "healthy": healthy})

    def _state(self) -> dict:
        if self.proc is None:
            return self._last
        return self._request({"op": "state"})

    # ------------------------------------------------------------------ lifecycle
    def start(self, timeout: float = 30.0) -> FakeGPUPlugin:
        """Serve and register with the kubelet (waiting up to `timeout` for its registration socket)."""
        if self.proc is not None:
            raise RuntimeError("the fake device plugin is already started")
        if self.log is None:
            fd, name = tempfile.mkstemp(prefix=f"fake-gpu-plugin-{self.endpoint}-", suffix=".log")
            os.close(fd)
            self.log = Path(name)
        argv = [sys.executable, "-m", "devcluster.device_plugin_process"]
        argv += ["--devices", json.dumps(self.device_ids), "--resource", self.resource]
        argv += ["--socket-dir", str(self.socket_dir), "--endpoint", self.endpoint, "--timeout", str(timeout)]
        path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
        with self.log.open("a") as log:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env={**os.environ, "PYTHONPATH": path},
                cwd=REPO,
            )
        try:
            # starting Python, loading the stubs, then up to `timeout` for the kubelet
            reply = self._read_reply(timeout + 60)
        except DevicePluginError:
            self.stop()
            raise
        if not reply["ok"]:
            self.stop()
            error = f"{reply['error']} (fake device plugin log: {self.log})"
            raise TimeoutError(error) if reply.get("type") == "TimeoutError" else DevicePluginError(error)
        self._last = reply["state"]
        return self

    def stop(self) -> None:
        """Unregister (the socket goes away, as the plugin's does when it ends) and end its process."""
        proc = self.proc
        if proc is None:
            return
        with self._lock:
            try:
                if proc.poll() is None and proc.stdin is not None:
                    proc.stdin.write(b'{"op": "stop"}\n')
                    proc.stdin.flush()
                    reply = self._read_reply(15)
                    if reply.get("state"):
                        self._last = reply["state"]
            except (OSError, DevicePluginError):
                pass  # it ended already, or will be made to
            finally:
                self.proc = None
                for pipe in (proc.stdin, proc.stdout):
                    if pipe is not None:
                        pipe.close()
                stop_process(proc, grace_s=10)
        self.socket.unlink(missing_ok=True)

    def __enter__(self) -> FakeGPUPlugin:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ the line protocol
    def _request(self, request: dict, timeout: float = 30.0) -> dict:
        with self._lock:
            proc = self.proc
            if proc is None or proc.stdin is None:
                raise DevicePluginError("the fake device plugin is not running")
            try:
                proc.stdin.write(json.dumps(request).encode() + b"\n")
                proc.stdin.flush()
            except OSError as err:
                raise DevicePluginError(
                    f"the fake device plugin's process is gone: {err}{self._tail()}"
                ) from None
            reply = self._read_reply(timeout)
        if not reply["ok"]:
            raise DevicePluginError(f"the fake device plugin refused {request}: {reply['error']}")
        self._last = reply["state"]
        return reply["state"]

    def _read_reply(self, timeout: float) -> dict:
        proc = self.proc
        assert proc is not None and proc.stdout is not None
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise DevicePluginError(
                    f"no answer from the fake device plugin in {timeout:.0f}s{self._tail()}"
                )
            readable, _, _ = select.select([proc.stdout], [], [], min(left, 1.0))
            if readable:
                break
            if proc.poll() is not None:
                raise DevicePluginError(f"the fake device plugin exited {proc.returncode}{self._tail()}")
        line = proc.stdout.readline()  # it writes whole lines: once one starts, the rest follows
        if not line:
            raise DevicePluginError(f"the fake device plugin closed its output{self._tail()}")
        return json.loads(line)

    def _tail(self) -> str:
        if self.log is None or not self.log.exists():
            return ""
        return f" (its log, {self.log}):\n{self.log.read_text()[-3000:]}"
