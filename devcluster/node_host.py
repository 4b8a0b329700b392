"""The host state a real node borrows: one lock per machine (the kubelet hard-codes its device-plugin folder),
the sysctls the kubelet sets at start, and the node's own cgroup tree under every mounted v1 hierarchy.

It must never touch a cgroup outside the node's `cgroup_root` or a sysctl outside KUBELET_SYSCTLS, and it puts
back the sysctl values it read.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import tempfile
import time
from pathlib import Path

from devcluster.device_plugin import DEVICE_PLUGIN_DIR

CGROUP_FS = Path("/sys/fs/cgroup")
# the kubelet sets these at start (KernelTunableModify); RealNode puts the host's values back once it is up
KUBELET_SYSCTLS = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
# one kubelet per machine may own the device-plugin folder, whose path the kubelet hard-codes
HOST_LOCK = Path(tempfile.gettempdir()) / "gpuledger-realnode.lock"


class RealNodeUnavailable(RuntimeError):
    """What this machine lacks to run a real node, and the command that provides it."""


def take_host_lock(lock_timeout: float) -> int:
    """The descriptor holding HOST_LOCK, once no other real node holds it (waiting up to `lock_timeout`)."""
    fd = os.open(HOST_LOCK, os.O_RDWR | os.O_CREAT, 0o644)
    deadline = time.monotonic() + lock_timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() > deadline:
                os.close(fd)
                raise RealNodeUnavailable(
                    f"another real node holds {HOST_LOCK} (one kubelet per machine "
                    f"owns {DEVICE_PLUGIN_DIR}); waited {lock_timeout:.0f}s"
                ) from None
            time.sleep(1)


def read_sysctls() -> dict[str, str]:
    return {k: (Path("/proc/sys") / k).read_text() for k in KUBELET_SYSCTLS}


def restore_sysctls(saved: dict[str, str]) -> None:
    for key, value in saved.items():
        path = Path("/proc/sys") / key
        if path.read_text() != value:
            path.write_text(value)


def _hierarchies() -> list[Path]:
    """Every mounted cgroup v1 hierarchy (cpu, memory, ..., name=systemd): the kubelet uses them all."""
    return [p for p in sorted(CGROUP_FS.iterdir()) if p.is_dir() and os.path.ismount(p)]


def make_cgroup_root(cgroup_root: str) -> None:
    """The kubelet requires --cgroup-root to exist; a cpuset child starts with no CPUs, so copy the
    parent's."""
    for hierarchy in _hierarchies():
        root = hierarchy / cgroup_root.lstrip("/")
        root.mkdir(exist_ok=True)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if (hierarchy / name).exists() and not (root / name).read_text().strip():
                (root / name).write_text((hierarchy / name).read_text())


def _cgroups_deepest_first(hierarchy: Path, cgroup_root: str) -> list[Path]:
    root = hierarchy / cgroup_root.lstrip("/")
    if not root.exists():
        return []
    return sorted((Path(d) for d, _, _ in os.walk(root)), key=lambda p: -len(p.parts))


def kill_cgroup_tree(cgroup_root: str) -> None:
    """SIGKILL every process in this node's cgroups (its pods' containers, nothing else), until none is
    left."""
    for _ in range(50):
        pids = {
            int(pid)
            for h in _hierarchies()
            for cg in _cgroups_deepest_first(h, cgroup_root)
            for pid in _read(cg / "cgroup.procs").split()
        }
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.1)


def remove_cgroup_tree(cgroup_root: str) -> None:
    for hierarchy in _hierarchies():
        for cgroup in _cgroups_deepest_first(hierarchy, cgroup_root):
            with contextlib.suppress(OSError):
                cgroup.rmdir()


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""
