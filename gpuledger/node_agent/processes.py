"""GPU memory held by processes outside Kubernetes: a driver-reported pid whose cgroup names no pod.

The kubelet puts every container of a pod under a cgroup that carries the pod's UID: `.../pod<uid>/...` with
the cgroupfs driver, `...-pod<uid with _ for ->.slice` with the systemd driver. A process anywhere else (a
user's shell, a `docker run`, a host daemon) holds GPU memory the ledger did not hand out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

from gpuledger.node_agent.probes import GpuProcess

DEFAULT_PROC_ROOT = Path("/proc")
# a pod UID: a UUID (dashes, or underscores in systemd slice names), or the 32 hex digits of a static pod's
_UUID = r"[0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}"
_POD = re.compile(rf"pod({_UUID}|[0-9a-f]{{32}})(?:\.slice)?(?=/|$)", re.M)


def pod_uid_in(cgroup: str) -> str | None:
    """The pod UID a /proc/<pid>/cgroup text names (any hierarchy line), or None."""
    found = _POD.search(cgroup)
    return found.group(1).replace("_", "-") if found else None


def read_cgroup(pid: int, proc_root: Path = DEFAULT_PROC_ROOT) -> str | None:
    """/proc/<pid>/cgroup, or None when it cannot be read (the process ended, or another pid namespace)."""
    try:
        return (Path(proc_root) / str(pid) / "cgroup").read_text()
    except OSError:
        return None


def external_usage(processes: Iterable[GpuProcess], proc_root: Path = DEFAULT_PROC_ROOT) -> dict[str, dict]:
    """Device index as text -> {"memoryMiB": summed, "pids": sorted}, for processes whose cgroup names no pod.

    A pid whose cgroup cannot be read is left out, not guessed: without the host's pids (hostPID, or the
    host's /proc under --proc-root) every process would look external.
    """
    external: dict[int, dict] = {}
    for proc in processes:
        cgroup = read_cgroup(proc.pid, proc_root)
        if cgroup is None or pod_uid_in(cgroup) is not None:
            continue
        entry = external.setdefault(proc.device, {"memoryMiB": 0, "pids": []})
        entry["memoryMiB"] += proc.used_memory_mib
        entry["pids"].append(proc.pid)
    return {
        str(index): {"memoryMiB": e["memoryMiB"], "pids": sorted(e["pids"])} for index, e in external.items()
    }
