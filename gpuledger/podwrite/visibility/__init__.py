"""Device visibility: how each mode shows a container its GPUs, one module per mode beside this one (a new
mode, e.g. one for dynamic resource allocation, is a module of its own and one entry in `MODES`)."""

from __future__ import annotations

from gpuledger.core.model import Placement, Request
from gpuledger.podwrite.containers import ensure_gpu_limits, gpu_containers, others, set_env_of
from gpuledger.podwrite.visibility import device_plugin, host_indices, runtime_uuids
from gpuledger.podwrite.visibility.mode import Env, PlacedEnv, VisibilityMode

MODES = {m.name: m for m in (host_indices.MODE, runtime_uuids.MODE, device_plugin.MODE)}


def mode(name: str) -> VisibilityMode:
    return MODES[name]


def placed_env(placement: Placement, name: str) -> PlacedEnv:
    """The variables each GPU container of a pod placed on `placement` gets."""
    indices = list(placement.devices) + [s.device for s in placement.shares]
    return mode(name).placed(indices, placement.uuids)


def waiting_env(request: Request, name: str) -> Env:
    """The variables each GPU container of a pod waiting for `request` gets: what depends on the devices is
    read by the kubelet from the placement's annotations when the container starts."""
    return mode(name).waiting(max(request.gpus, 1 if request.is_shared else 0))


def write_placed(pod: dict, placement: Placement, name: str, gpu_resource: str) -> None:
    """Write a placement's device variables (and GPU limits where the kubelet picks) into `pod`, a copy
    whose spec may be written (gpuledger.podwrite.copy_on_write.shallow_pod)."""
    _write(pod, mode(name), placed_env(placement, name), len(placement.devices), gpu_resource)


def write_waiting(pod: dict, request: Request, name: str, gpu_resource: str) -> None:
    """Write a waiting pod's device variables (and GPU limits where the kubelet picks) into `pod`."""
    _write(pod, mode(name), waiting_env(request, name), request.gpus, gpu_resource)


def _write(pod: dict, visibility: VisibilityMode, env: Env, gpus: int, gpu_resource: str) -> None:
    spec = pod["spec"]
    targets = gpu_containers(pod, gpu_resource)  # (before a limit is added: it names container 0)
    if visibility.kubelet_picks:
        ensure_gpu_limits(spec, gpu_resource, gpus)
    set_env_of(spec, targets, env)
    if visibility.others is not None:
        set_env_of(spec, others(spec, targets), visibility.others)
