"""Which containers get a placement's devices, and how their environment and GPU limits are written."""

from __future__ import annotations

from typing import Any

from gpuledger.podwrite.copy_on_write import container, copied, dict_at, list_at

CONTAINER_KINDS = ("initContainers", "containers")


def gpu_containers(pod: dict, resource: str) -> list[tuple[str, int]]:
    """(kind, index) of the containers that get the devices: those with a GPU limit, else every container."""
    spec = dict_at(pod, "spec")
    with_limit, every = [], []
    for kind in CONTAINER_KINDS:
        containers = spec.get(kind)
        if not isinstance(containers, list):
            continue
        for i, c in enumerate(containers):
            if not isinstance(c, dict):
                continue
            every.append((kind, i))
            res = dict_at(c, "resources")
            limits = dict_at(res, "limits")
            requests = dict_at(res, "requests")
            value = limits.get(resource, requests.get(resource))
            if value not in (None, 0, "0"):
                with_limit.append((kind, i))
    return with_limit or every


def set_env(container: dict, values: dict[str, Any]) -> None:
    """Overwrite (or remove, for None) these variables; user-supplied values never survive. A value is text,
    or a dict: the entry's `valueFrom`."""
    env = list_at(container, "env")
    kept = [e for e in env if not (isinstance(e, dict) and e.get("name") in values)]
    for k, v in values.items():
        if isinstance(v, dict):
            kept.append({"name": k, "valueFrom": v})
        elif v is not None:
            kept.append({"name": k, "value": v})
    if kept or "env" in container:
        container["env"] = kept


def set_env_of(spec: dict, targets: list[tuple[str, int]], values: dict[str, Any]) -> None:
    """`set_env` on each (kind, index) of `targets`, each container copied first."""
    for kind, i in targets:
        set_env(container(spec, kind, i), values)


def others(spec: dict, targets: list[tuple[str, int]]) -> list[tuple[str, int]]:
    """(kind, index) of the containers of `spec` not among `targets`."""
    chosen = set(targets)
    return [
        (kind, i)
        for kind in CONTAINER_KINDS
        for i, c in enumerate(spec.get(kind) or [])
        if (kind, i) not in chosen and isinstance(c, dict)
    ]


def ensure_gpu_limits(spec: dict, resource: str, gpus: int) -> None:
    """Ask the kubelet for `gpus` devices on container 0 when no container names the resource (a count from
    annotations only): where the kubelet's device plugin picks the devices."""
    containers = spec.get("containers")
    if not gpus or not isinstance(containers, list) or not containers:
        return
    for kind in CONTAINER_KINDS:
        for c in spec.get(kind) or []:
            res = dict_at(c, "resources") if isinstance(c, dict) else {}
            if resource in (res.get("limits") or {}) or resource in (res.get("requests") or {}):
                return
    c = container(spec, "containers", 0)
    resources = copied(c, "resources")
    limits = copied(resources, "limits")
    limits[resource] = str(gpus)
