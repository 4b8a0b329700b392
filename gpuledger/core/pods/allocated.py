"""The CPU and memory the kubelet has given each container of a running pod, read from the pod's status.

A pod resized in place (`kubectl patch --subresource resize`, GA in Kubernetes 1.35) keeps its new size in
`spec`, but holds it only once its node's kubelet accepts it: the kubelet then reports the accepted size in
`status.containerStatuses[].allocatedResources` and, once applied, in `.resources.requests`. A resize the
kubelet defers (the node has no room: the pod's `PodResizePending` condition) or finds infeasible leaves both
as they were. So a container holds the larger of what is allocated and what is applied (a decrease holds the
old size until it is applied), and a container the status does not report holds what its spec asks. The
ledger counts each pod that was resized this way (`resized`: its spec changed since it was created), placed
pods included, on every update the sync sees, and a rebuild reads the same fields: rebuilt equals live after
resizes.
"""

from __future__ import annotations

from typing import Any

from gpuledger.core.pods.quantity import cpu_milli, memory_mib
from gpuledger.core.pods.quantity import parse_or_default as _lenient

RESOURCES = ("cpu", "memory")
_PARSE = {"cpu": cpu_milli, "memory": memory_mib}


def _statuses(status: Any) -> list[dict]:
    if type(status) is not dict:
        return []
    out: list[dict] = []
    for field in ("containerStatuses", "initContainerStatuses"):
        entries = status.get(field)
        if type(entries) is list:
            out.extend(e for e in entries if type(e) is dict)
    return out


def _reported(entry: dict) -> tuple[dict, dict]:
    allocated = entry.get("allocatedResources")
    applied = (entry.get("resources") or {}).get("requests") if type(entry.get("resources")) is dict else None
    return (allocated if type(allocated) is dict else {}), (applied if type(applied) is dict else {})


def allocated_sizes(pod: dict, problems: list[str] | None = None) -> dict[str, dict[str, int]]:
    """Container name -> {resource: held} for the CPU (milli) and memory (MiB) the status reports for it:
    the larger of allocated and applied. A resource the status does not report is left out (its spec holds);
    a malformed value is recorded in `problems` and left out."""
    name = (pod.get("metadata") or {}).get("name", "")
    out: dict[str, dict[str, int]] = {}
    for entry in _statuses(pod.get("status")):
        container = entry.get("name")
        if type(container) is not str:
            continue
        allocated, applied = _reported(entry)
        sizes: dict[str, int] = {}
        for resource in RESOURCES:
            values = [
                _lenient(
                    _PARSE[resource], raw, -1, problems, f"pod {name} status {container} {field} {resource}"
                )
                for field, raw in (
                    ("allocatedResources", allocated.get(resource)),
                    ("resources", applied.get(resource)),
                )
                if raw is not None
            ]
            values = [v for v in values if v >= 0]
            if values:
                sizes[resource] = max(values)
        if sizes:
            out[container] = sizes
    return out


def resized(pod: dict) -> bool:
    """Whether the pod's spec changed since it was created (`metadata.generation` above 1: the API server
    counts every spec change of a pod, and an in-place resize is one). A pod that was not resized holds what
    it was admitted with, and nothing of its status is read: a rebuild's pods are nearly all such."""
    meta = pod.get("metadata")
    generation = meta.get("generation") if type(meta) is dict else None
    return type(generation) is int and generation > 1
