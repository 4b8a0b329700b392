"""One containerd for one real node: its own root, state, sockets and CNI bridge network, all under the node's
folder.

containerd 2 (and its shim and runc) built from their Go modules into the cache (devcluster/build_runtime.sh)
when present, with a version 3 config; otherwise Debian's containerd 1.6 from PATH, with a version 2 config.

Binds only unix sockets and a loopback streaming port; never reads /etc/containerd nor uses the system's
socket. `teardown` ends only what this containerd started (its shims, found by their -address), unmounts its
mounts and removes its entries from libcni's cache, the one thing it writes outside the folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from devcluster import images
from devcluster.binaries import CACHE
from devcluster.processes import stop_process

CNI_BIN_DIR = Path(
    os.environ.get("GPULEDGER_CNI_BIN_DIR", "/usr/lib/cni")
)  # Debian's containernetworking-plugins
CNI_CACHE = Path("/var/lib/cni/results")  # libcni's default cache, which containerd 1.6 does not let us move
RUNTIME_BINARIES = ("containerd", "containerd-shim-runc-v2", "ctr", "runc")
CONTAINERD_VERSION = os.environ.get("CONTAINERD_VERSION", "2.4.2")


def runtime_bin_dir() -> Path | None:
    """The cached containerd 2 build's bin/ (devcluster/build_runtime.sh) when it holds every runtime binary;
    None: the runtime comes from PATH (Debian's containerd 1.6 and runc)."""
    folder = Path(
        os.environ.get("GPULEDGER_RUNTIME_BIN_DIR") or CACHE / f"containerd-v{CONTAINERD_VERSION}" / "bin"
    )
    return folder if all(os.access(folder / b, os.X_OK) for b in RUNTIME_BINARIES) else None


def runtime_binary(name: str) -> str | None:
    """Where `name` (one of RUNTIME_BINARIES) comes from: the cached build, else PATH; None if neither."""
    folder = runtime_bin_dir()
    return str(folder / name) if folder else shutil.which(name)


def runtime_env() -> dict[str, str]:
    """The environment containerd and ctr run with: the cached build's bin/ first on PATH, so containerd
    starts its own shim (which finds runc there too)."""
    env = dict(os.environ)
    folder = runtime_bin_dir()
    if folder:
        env["PATH"] = f"{folder}{os.pathsep}{env.get('PATH', os.defpath)}"
    return env


@contextlib.contextmanager
def _runtime_path():
    """images.import_images runs `ctr` from PATH: the cached build's, while it runs."""
    saved = os.environ.get("PATH")
    os.environ["PATH"] = runtime_env()["PATH"]
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("PATH", None)
        else:
            os.environ["PATH"] = saved


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

    def config_toml(self, version: int | None = None) -> str:
        """Version 3 where the cached containerd 2 runs, else version 2 (Debian's containerd 1.6).

        containerd 2.4 reads version 4, where [grpc] and [ttrpc] moved to server plugins
        (io.containerd.server.v1.grpc, ...): a version 4 config with them at the top would serve on the
        host's /run/containerd/containerd.sock. Version 3, which every containerd 2 reads, it migrates at
        start (one warning in its log, "Configuration migrated from version 3"; nothing deprecated)."""
        version = version or (3 if runtime_bin_dir() else 2)
        return self._config_v3() if version == 3 else self._config_v2()

    def _common_toml(self, version: int) -> str:
        return f"""version = {version}
root = "{self.folder / "root"}"
state = "{self.folder / "state"}"
[grpc]
  address = "{self.socket}"
[ttrpc]
  address = "{self.socket}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{self.folder / "opt"}"
"""

    def _runc_toml(self, table: str) -> str:
        """The runc runtime (and the GPU operator's `nvidia` handler, on a GPU node runc plus NVIDIA's
        prestart hook): the cached runc where there is one, named by BinaryName."""
        folder = runtime_bin_dir()
        out = ""
        for name in ("runc", "nvidia"):
            out += f'[{table}.runtimes.{name}]\n  runtime_type = "io.containerd.runc.v2"\n'
            if folder:
                out += f'  [{table}.runtimes.{name}.options]\n    BinaryName = "{folder / "runc"}"\n'
        return out

    # these machines drop CAP_SYS_RESOURCE from every bounding set: runc could not lower a sandbox's
    # oom_score_adj to the kubelet's -998 ("nsexec: failed to update /proc/self/oom_score_adj: Permission
    # denied"), hence restrict_oom_score_adj
    def _config_v2(self) -> str:
        cri = 'plugins."io.containerd.grpc.v1.cri"'
        return (
            self._common_toml(2)
            + f"""[{cri}]
  sandbox_image = "{images.PAUSE_IMAGE}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"
"""
            + self._runc_toml(f"{cri}.containerd")
            + f"""[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{self.folder / "net.d"}"
"""
        )

    def _config_v3(self) -> str:
        rt = 'plugins."io.containerd.cri.v1.runtime"'
        img = 'plugins."io.containerd.cri.v1.images"'
        return (
            self._common_toml(3)
            + f"""[{img}]
  snapshotter = "overlayfs"
[{img}.pinned_images]
  sandbox = "{images.PAUSE_IMAGE}"
[plugins."io.containerd.grpc.v1.cri"]
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
# NRI (on by default in containerd 2) would listen on the host's one /var/run/nri/nri.sock
[plugins."io.containerd.nri.v1.nri"]
  disable = true
[{rt}]
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
[{rt}.containerd]
  default_runtime_name = "runc"
"""
            + self._runc_toml(f"{rt}.containerd")
            + f"""[{rt}.cni]
  bin_dirs = ["{CNI_BIN_DIR}"]
  conf_dir = "{self.folder / "net.d"}"
"""
        )

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
                [runtime_binary("containerd") or "containerd", "--config", str(config)],
                env=runtime_env(),
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
        with _runtime_path():
            images.import_images(self.socket, images.build_images(image_cache))

    def _serving(self) -> bool:
        if not self.socket.exists():
            return False
        proc = subprocess.run(
            [runtime_binary("ctr") or "ctr", "--address", str(self.socket), "version"],
            capture_output=True,
            timeout=10,
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
