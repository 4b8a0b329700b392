"""Which device requests a pod may not write itself, and why.

A runtime that honours NVIDIA_VISIBLE_DEVICES (or a CDI annotation, or the NVIDIA device list passed as
volume mounts) gives an unprivileged container the GPUs named there: `all` is every GPU of the node. Only
gpuledger's placement chooses a pod's GPUs, so in opted-in namespaces a pod may carry these only as the
signed placement implies them, or with a value that exposes no GPU. CUDA_VISIBLE_DEVICES is different: it
only indexes the devices a container already sees, so a user's value is kept unless the placement sets it,
and then replaced with a warning (`replacements`). Pure functions over the pod dict; docs/webhook.md,
"Device environment a pod may not set".
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterator

from gpuledger.core.model import Placement, Request
from gpuledger.core.pods.placement_codec import decode_bound
from gpuledger.core.pods.waiting_codec import decode_waiting
from gpuledger.names import PLACEMENT_ANNOTATION, WAITING_ANNOTATION
from gpuledger.podwrite import visibility
from gpuledger.podwrite.containers import CONTAINER_KINDS, gpu_containers, others
from gpuledger.podwrite.copy_on_write import dict_at as _dict_at
from gpuledger.podwrite.copy_on_write import list_at as _list_at
from gpuledger.podwrite.visibility.runtime_uuids import VISIBLE_DEVICES_FROM
from gpuledger.podwrite.visibility.variables import CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES
from gpuledger.webhook.config import WebhookConfig

ALL_KINDS = (*CONTAINER_KINDS, "ephemeralContainers")
NO_GPU_VALUES = ("", "void", "none")  # the NVIDIA runtime exposes no GPU for these
CDI_PREFIX = "cdi.k8s.io/"
DEVICE_LIST_NAME = "nvidia-container-devices"
DEVICE_LIST_MOUNTS = (f"/var/run/{DEVICE_LIST_NAME}", f"/run/{DEVICE_LIST_NAME}")
ACCEPTED = (
    "accepted: no such setting (NVIDIA_VISIBLE_DEVICES may only be 'void' or 'none', which expose no GPU); "
    "ask for GPUs with resources.limits nvidia.com/gpu or the annotation topology.scheduler/gpu-count, and "
    "gpuledger writes the device variables from its placement"
)


def _containers(pod: dict) -> Iterator[tuple[str, int, dict]]:
    spec = _dict_at(pod, "spec")
    for kind in ALL_KINDS:
        for i, c in enumerate(_list_at(spec, kind)):
            if isinstance(c, dict):
                yield kind, i, c


def _named(container: dict) -> str:
    return f'container "{container.get("name", "")}"'


def _env(container: dict, name: str) -> list[dict]:
    return [e for e in _list_at(container, "env") if isinstance(e, dict) and e.get("name") == name]


# what `placed` holds for a GPU container of a pod still waiting: its devices are its placement's, to come
WAITING_DEVICES = "<the devices of its placement, to come>"


def waiting_placed(pod: dict, request: Request, config: WebhookConfig) -> dict[tuple[str, int], str]:
    """(kind, index) -> what gpuledger's admission of a waiting pod writes for NVIDIA_VISIBLE_DEVICES there
    (patch.apply_waiting)."""
    value = visibility.waiting_env(request, config.visibility_mode).get(NVIDIA_VISIBLE_DEVICES)
    if value is None:
        return {}
    targets = gpu_containers(pod, config.gpu_resource)
    return _with_others(
        pod, dict.fromkeys(targets, value if isinstance(value, str) else WAITING_DEVICES), config
    )


def _ours(value_from: object) -> bool:
    """gpuledger's own `valueFrom` for NVIDIA_VISIBLE_DEVICES (its apiVersion defaulted or not)."""
    if not isinstance(value_from, dict) or set(value_from) != {"fieldRef"}:
        return False
    ref, expected = value_from["fieldRef"], VISIBLE_DEVICES_FROM["fieldRef"]
    return (
        isinstance(ref, dict)
        and set(ref) <= {"apiVersion", "fieldPath"}
        and ref.get("fieldPath") == expected["fieldPath"]
        and ref.get("apiVersion", "v1") == "v1"
    )


def placed_env(pod: dict, placement: Placement | None, config: WebhookConfig) -> dict[tuple[str, int], str]:
    """(kind, index) -> the NVIDIA_VISIBLE_DEVICES value gpuledger's placement writes there (patch.py)."""
    if placement is None:
        return {}
    value = visibility.placed_env(placement, config.visibility_mode).get(NVIDIA_VISIBLE_DEVICES)
    if value is None:  # device-plugin: the kubelet's plugin sets it, outside the pod spec
        return {}
    targets = gpu_containers(pod, config.gpu_resource)
    return _with_others(pod, dict.fromkeys(targets, value), config)


def _with_others(
    pod: dict, placed: dict[tuple[str, int], str], config: WebhookConfig
) -> dict[tuple[str, int], str]:
    """`placed` and what the mode writes in the pod's other containers (runtime-uuids: `void`)."""
    value = (visibility.mode(config.visibility_mode).others or {}).get(NVIDIA_VISIBLE_DEVICES)
    if isinstance(value, str):
        placed.update(dict.fromkeys(others(_dict_at(pod, "spec"), list(placed)), value))
    return placed


def findings(pod: dict, placed: dict[tuple[str, int], str]) -> list[str]:
    """Every device request in `pod` that neither `placed` implies nor exposes no GPU, as 'what, where'."""
    found = []
    for kind, i, c in _containers(pod):
        for e in _env(c, NVIDIA_VISIBLE_DEVICES):
            where = f"spec.{kind}[{i}].env[{NVIDIA_VISIBLE_DEVICES}]"
            if "valueFrom" in e:
                if _ours(e.get("valueFrom")) and placed.get((kind, i), "void") not in NO_GPU_VALUES:
                    continue  # gpuledger's own for a pod that waited: its placement's devices, read at start
                found.append(f"{_named(c)} sets {where} from valueFrom (not readable at admission)")
                continue
            value = str(e.get("value") or "")
            if value not in NO_GPU_VALUES and placed.get((kind, i)) != value:
                found.append(f"{_named(c)} sets {where}={value!r}")
        for j, m in enumerate(_list_at(c, "volumeMounts")):
            raw = m.get("mountPath") if isinstance(m, dict) else None
            if not raw or DEVICE_LIST_NAME not in str(raw):  # (normalizing drops path parts, never adds one)
                continue
            path = _clean(raw)
            if any(path == p or path.startswith(p + "/") for p in DEVICE_LIST_MOUNTS):
                found.append(
                    f"{_named(c)} mounts spec.{kind}[{i}].volumeMounts[{j}].mountPath={path!r} "
                    "(the NVIDIA runtime reads GPU requests from mounts there)"
                )
    for key, value in _dict_at(_dict_at(pod, "metadata"), "annotations").items():
        if str(key).startswith(CDI_PREFIX) and _names_gpu(str(value)):
            found.append(f"annotation {key}={str(value)!r} asks the runtime for GPU devices by CDI")
    for j, v in enumerate(_list_at(_dict_at(pod, "spec"), "volumes")):
        path = _clean(_dict_at(v, "hostPath").get("path")) if isinstance(v, dict) else ""
        if path and _exposes_gpus(path):
            found.append(
                f'volume "{v.get("name", "")}" mounts spec.volumes[{j}].hostPath.path={path!r} '
                "(the host's GPU device nodes)"
            )
    return found


def refusal(
    pod: dict,
    key: bytes,
    config: WebhookConfig,
    before: dict | None = None,
    placement: Placement | None = None,
) -> str | None:
    """Why `pod` may not be admitted as it is, or None. The only values accepted besides the harmless ones are
    those its own signed placement annotation implies (our earlier write, seen on reinvocation and by the
    validating webhook); whether that placement belongs to this pod is the handler's check. On UPDATE,
    `before` (the stored pod) excuses what it already had: only what the update adds is refused (an
    ephemeral container, a CDI annotation), so pods admitted before this rule stay updatable. `placement`:
    the pod's own placement where the caller already verified it (not decoded again)."""
    found = _problems(pod, key, config, placement)
    if found and before is not None:
        old = set(_problems(before, key, config))
        found = [f for f in found if f not in old]
    if not found:
        return None
    return (
        f"{'; '.join(found)}: a pod may not choose its own GPUs (the container runtime would expose them "
        f"to it, every GPU of the node for 'all'); {ACCEPTED}"
    )


def _problems(pod: dict, key: bytes, config: WebhookConfig, placement: Placement | None = None) -> list[str]:
    if placement is not None:  # (what it excuses can only shorten the list: one pass, not two)
        return findings(pod, placed_env(pod, placement, config))
    found = findings(pod, {})
    if not found:  # the fast path: most pods set nothing of this, and then nothing is decoded
        return found
    annotations = _dict_at(_dict_at(pod, "metadata"), "annotations")
    text = annotations.get(PLACEMENT_ANNOTATION)
    decoded = decode_bound(text, key) if isinstance(text, str) else None
    if decoded is not None:
        return findings(pod, placed_env(pod, decoded[0], config))
    ticket = decode_waiting(annotations.get(WAITING_ANNOTATION), key)
    return found if ticket is None else findings(pod, waiting_placed(pod, ticket.request, config))


def replacements(before: dict, after: dict, mode: str) -> list[str]:
    """Warnings for each container whose own CUDA_VISIBLE_DEVICES the placement replaced or removed."""
    warnings = []
    spec_after = _dict_at(after, "spec")
    for kind, i, c in _containers(before):
        mine = _env(c, CUDA_VISIBLE_DEVICES)
        if not mine or kind not in CONTAINER_KINDS:
            continue
        theirs = _list_at(spec_after, kind)
        now = _env(theirs[i], CUDA_VISIBLE_DEVICES) if i < len(theirs) and isinstance(theirs[i], dict) else []
        if now == mine:
            continue
        old = "<valueFrom>" if "valueFrom" in mine[-1] else str(mine[-1].get("value") or "")
        what = f"with {now[-1].get('value')!r}" if now else "(removed: this container gets no GPU)"
        warnings.append(
            f"gpuledger replaced CUDA_VISIBLE_DEVICES={old} in {_named(c)} {what}: in visibility mode {mode} "
            "the placement sets it (it numbers the GPUs the container sees); docs/webhook.md"
        )
    return warnings


def _clean(path: object) -> str:
    """An absolute path without '..', '.', or repeated slashes."""
    return posixpath.normpath("/" + str(path).lstrip("/")) if path else ""


def _exposes_gpus(path: str) -> bool:
    """A host path holding GPU device nodes: /dev/nvidia*, /dev/dri, or a directory above them."""
    return path in ("/", "/dev", "/dev/dri") or path.startswith(("/dev/nvidia", "/dev/dri/"))


def _names_gpu(value: str) -> bool:
    """A CDI annotation's value lists fully qualified devices, vendor.com/class=name, by commas."""
    for device in value.split(","):
        kind = device.strip().split("=", 1)[0].strip().lower()
        vendor, _, cls = kind.partition("/")
        if vendor == "nvidia.com" or cls in ("gpu", "mig"):
            return True
    return False
