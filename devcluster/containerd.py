"""One containerd for one real node: its own root, state, sockets and CNI bridge network, all under the node's
folder.

Binds only unix sockets and a loopback streaming port; never reads /etc/containerd nor uses the system's
socket. `teardown` ends only what this containerd started (its shims, found by their -address), unmounts its
mounts and removes its entries from libcni's cache, the one thing it writes outside the folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from devcluster import images
from devcluster.processes import stop_process

CNI_BIN_DIR = Path(
    os.environ.get("GPULEDGER_CNI_BIN_DIR", "/usr/lib/cni")
)  # Debian's containernetworking-plugins
CNI_CACHE = Path("/var/lib/cni/results")  # libcni's default cache, which containerd 1.6 does not let us move
RUNTIME_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr", "runc")


@dataclass
class Containerd:
    folder: Path
    bridge: str  # at most 15 characters (a Linux interface name)
    pod_cidr: str
    # the bridge takes the subnet's first address and pods route through it: the host reaches pods and a
    # Service's virtual IP works both ways (devcluster/services.py); off, pods have no route off the node
    gateway: bool = False
    proc: subprocess.Popen | None = None

    @property
    def socket(self) -> Path:
        return self.folder / "containerd.sock"

    @property
    def log(self) -> Path:
        return self.folder / "containerd.log"

    def config_toml(self) -> str:
        runc = 'runtime_type = "io.containerd.runc.v2"\n'
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return f"""version = 2
root = "{self.folder / "root"}"
state = "{self.folder / "state"}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{self.folder / "opt"}"
[{cri}]
  sandbox_image = "{images.PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true
  # these machines drop CAP_SYS_RESOURCE from every bounding set: runc could not lower a sandbox's
  # oom_score_adj to the kubelet's -998 ("nsexec: failed to update /proc/self/oom_score_adj: Permission
  # denied")
  restrict_oom_score_adj = true
  [{cri}.containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [{cri}.containerd.runtimes.runc]
      {runc}
    # the GPU operator's RuntimeClass handler; on a GPU node it is runc plus NVIDIA's prestart hook
    [{cri}.containerd.runtimes.nvidia]
      {runc}
  [{cri}.cni]
    bin_dir = "{CNI_BIN_DIR}"
    conf_dir = "{self.folder / "net.d"}"
"""

    def cni_conflist(self) -> dict:
        """A bridge with no masquerade and, unless `gateway`, no gateway: pods get an address and no route
        off the node (no iptables)."""
        return {
            "cniVersion": "0.4.0",
            "name": "gpuledger-realnode",
            "plugins": [
                {
                    "type": "bridge",
                    "bridge": self.bridge,
                    "isGateway": self.gateway,
                    "isDefaultGateway": self.gateway,
                    "ipMasq": False,
                    "ipam": {
                        "type": "host-local",
                        "ranges": [[{"subnet": self.pod_cidr}]],
                        "dataDir": str(self.folder / "cni-ipam"),
                    },
                }
            ],
        }

    def start(self, image_cache: Path, timeout: float = 30.0) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        (self.folder / "net.d").mkdir(exist_ok=True)
        (self.folder / "net.d" / "10-gpuledger.conflist").write_text(
            json.dumps(self.cni_conflist(), indent=1)
        )
        config = self.folder / "config.toml"
        config.write_text(self.config_toml())
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                ["containerd", "--config", str(config)],
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
        deadline = time.monotonic() + timeout
        while not self._serving():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"containerd did not come up ({self.log}):\n{tail(self.log)}")
            time.sleep(0.1)
        images.import_images(self.socket, images.build_images(image_cache))

    def _serving(self) -> bool:
        if not self.socket.exists():
            return False
        proc = subprocess.run(
            ["ctr", "--address", str(self.socket), "version"], capture_output=True, timeout=10
        )
        return proc.returncode == 0

    def shim_pids(self) -> list[int]:
        """The runc v2 shims this containerd started: their command line names its socket as -address."""
        wanted = str(self.socket).encode()
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                try:
                    argv = (entry / "cmdline").read_bytes().split(b"\0")
                except OSError:
                    continue
                if argv and argv[0].endswith(b"containerd-shim-runc-v2") and wanted in argv:
                    pids.append(int(entry.name))
        return pids

    def teardown(self) -> None:
        """containerd and its shims killed, its mounts (rootfs overlays, netns, shm) lazily unmounted, bridge
        gone. The containers themselves are killed beforehand through their cgroups (RealNode.stop)."""
        sandboxes = [
            p.name for p in (self.folder / "root" / "io.containerd.grpc.v1.cri" / "sandboxes").glob("*")
        ]
        for pid in self.shim_pids():
            _kill(pid)
        stop_process(self.proc, grace_s=5)
        for mount in reversed(mounts_under(self.folder)):
            subprocess.run(["umount", "-l", mount], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
        for sandbox in sandboxes:  # libcni caches each attachment here; no CNI DEL ran for killed sandboxes
            for cached in CNI_CACHE.glob(f"*-{sandbox}-*"):
                cached.unlink(missing_ok=True)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


def mounts_under(folder: Path) -> list[str]:
    """Mount points below `folder`, shallowest first (mountinfo escapes spaces and the like as octal)."""
    prefix = str(folder).rstrip("/") + "/"
    found = []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split()[4].encode().decode("unicode_escape")
        if point.startswith(prefix):
            found.append(point)
    return sorted(set(found), key=lambda p: p.count("/"))


def tail(path: Path, lines: int = 30) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:]) if path.exists() else ""
