"""The one parsing layer between Kubernetes objects (plain dicts) and the core's types.

Nodes become `NodeInfo`, pods become `PodUsage` (what a pod holds on its node, including its signed
placement, read by `placement_codec`). Nothing here raises on bad cluster data: a malformed value is
reported and ignored, because one odd object must never stop the ledger from following the cluster.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from functools import lru_cache
from typing import Any, NamedTuple

from gpuledger.core.model import Device, NodeInfo, Placement, Taint
from gpuledger.core.pods.allocated import allocated_sizes, resized
from gpuledger.core.pods.device_truth import parse_device_holders
from gpuledger.core.pods.placement_codec import (
    binding_mismatch,
    decode_bound,
)
from gpuledger.core.pods.quantity import (
    ascii_int,
    count,
    cpu_milli,
    memory_mib,
)
from gpuledger.core.pods.quantity import parse_or_default as _lenient  # the lenient policy: record, default
from gpuledger.names import (
    ACCELERATOR_LABEL,
    CHEAP_LABEL,
    DEVICES_ANNOTATION,
    GPU_MEMORY_LABEL,
    GPU_RESOURCE,
    HOLDERS_ANNOTATION,
    LAST_UPDATE_ANNOTATION,
    LEAF_LABEL,
    PLACEMENT_ANNOTATION,
    PRODUCT_LABEL,
    SCHEDULABLE_LABEL,
    SPINE_LABEL,
)

TERMINAL_PHASES = ("Succeeded", "Failed")
MAX_DEVICES_PER_NODE = 4096
_DIGITS = re.compile(r"([0-9]+)")
_TIMESTAMP = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9:.]{8,15}Z", re.ASCII)


# ---------------------------------------------------------------------------------------------- objects


def iter_objects(objects: Any) -> Iterator[dict]:
    """Every object in a `kubectl get -o yaml` document, a v1 List, a list of either, or single objects."""
    if objects is None:
        return
    if isinstance(objects, dict):
        if objects.get("kind") in ("Pod", "Node"):
            yield objects
        elif isinstance(objects.get("items"), list) and (
            str(objects.get("kind") or "").endswith("List")
            or "metadata" not in objects
            or objects.get("kind") is None
        ):
            for item in objects["items"]:
                yield from iter_objects(item)
        else:
            yield objects
        return
    if isinstance(objects, (str, bytes)) or not hasattr(objects, "__iter__"):
        return  # not an object: ignored
    for obj in objects:
        if isinstance(obj, dict) and obj.get("kind") in ("Pod", "Node"):
            yield obj  # the common case, without a nested generator
        else:
            yield from iter_objects(obj)


def kind_of(obj: dict) -> str:
    """'Node' or 'Pod' (inferring it from the shape when `kind` is missing, as in some List items)."""
    kind = obj.get("kind")
    if kind:
        return str(kind)
    spec = obj.get("spec")
    spec = spec if isinstance(spec, dict) else {}
    if "containers" in spec:
        return "Pod"
    status = obj.get("status")
    status = status if isinstance(status, dict) else {}
    if "allocatable" in status or "capacity" in status or "taints" in spec or "podCIDR" in spec:
        return "Node"
    return ""


def _labels(obj: dict) -> dict[str, str]:
    return {str(k): str(v) for k, v in ((obj.get("metadata") or {}).get("labels") or {}).items()}


def _annotations(obj: dict) -> dict[str, str]:
    return {str(k): str(v) for k, v in ((obj.get("metadata") or {}).get("annotations") or {}).items()}


def _is_true(value: str | None) -> bool:
    return str(value).strip().lower() in ("true", "1", "yes")


def node_from_object(obj: dict, config: Any = None, problems: list[str] | None = None) -> NodeInfo:
    """A Node dict as `NodeInfo`. `config` supplies `spine_label`/`leaf_label` (a LedgerConfig or None).

    Malformed values are appended to `problems` (when given) and replaced by safe defaults: a bad device
    annotation falls back to devices 0..N-1 from allocatable `nvidia.com/gpu`.
    """
    meta = obj.get("metadata") or {}
    name = str(meta.get("name", ""))
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    alloc = status.get("allocatable") or status.get("capacity") or {}
    labels = _labels(obj)
    annotations = _annotations(obj)
    spine_label = getattr(config, "spine_label", SPINE_LABEL)
    leaf_label = getattr(config, "leaf_label", LEAF_LABEL)

    cpu = _lenient(lambda v: cpu_milli(v, round_up=False), alloc.get("cpu"), 0, problems, f"node {name} cpu")
    mem = _lenient(
        lambda v: memory_mib(v, round_up=False), alloc.get("memory"), 0, problems, f"node {name} memory"
    )
    gpus = _lenient(_device_count, alloc.get(GPU_RESOURCE), 0, problems, f"node {name} {GPU_RESOURCE}")
    product = labels.get(PRODUCT_LABEL) or labels.get(ACCELERATOR_LABEL) or ""
    gpu_mem = _lenient(
        ascii_int,
        labels.get(GPU_MEMORY_LABEL),
        0,
        problems,
        f"node {name} label {GPU_MEMORY_LABEL} (MiB, an integer)",
    )

    devices = None
    if DEVICES_ANNOTATION in annotations:
        devices = _devices_from_annotation(annotations[DEVICES_ANNOTATION], product, gpu_mem, name, problems)
    if devices is None:
        devices = _plain_devices(max(0, gpus), product, gpu_mem)
    truth = None
    # who holds each device, by the node agent (gpuledger.core.books.truth)
    if HOLDERS_ANNOTATION in annotations:
        truth = parse_device_holders(
            annotations[HOLDERS_ANNOTATION], name, {d.index for d in devices}, problems
        )

    ready = True
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Ready":
            ready = str(cond.get("status")) == "True"
    taints = tuple(
        Taint(key=str(t.get("key", "")), value=str(t.get("value", "") or ""), effect=str(t.get("effect", "")))
        for t in spec.get("taints") or []
        if isinstance(t, dict)
    )
    return NodeInfo(
        name=name,
        cpu_milli=cpu,
        memory_mib=mem,
        devices=devices,
        labels=tuple(sorted(labels.items())),
        taints=taints,
        ready=ready,
        unschedulable=bool(spec.get("unschedulable", False)),
        spine=labels.get(spine_label, ""),
        leaf=labels.get(leaf_label, ""),
        product=product,
        cheap=_is_true(labels.get(CHEAP_LABEL)),
        gpu_schedulable=labels.get(SCHEDULABLE_LABEL, "true").strip().lower() not in ("false", "0", "no"),
        utilization_at=utilization_timestamp(annotations.get(LAST_UPDATE_ANNOTATION)),
        truth=truth,
    )


@lru_cache(maxsize=1024)
def _plain_devices(count: int, product: str, memory_mib: int) -> tuple[Device, ...]:
    """Devices 0..count-1 of one model, for a node without the agent's device annotation. Nodes of one kind
    share the tuple (a `Device` is frozen): at 65,000 nodes, 520,000 objects fewer to build and keep."""
    return tuple(Device(index=i, product=product, memory_mib=memory_mib) for i in range(count))


def utilization_pct(value: Any) -> int | None:
    """A device entry's NVML utilization, 0..100; None when absent or not an integer in range (ignored)."""
    if isinstance(value, bool) or not isinstance(value, (int, str)):
        return None
    try:
        pct = ascii_int(value)
    except (ValueError, TypeError):
        return None
    return pct if 0 <= pct <= 100 else None


def utilization_timestamp(value: Any) -> float | None:
    """`agentaflow.gpu/last-update` ("2025-01-01T00:00:00Z", RFC 3339 UTC) as epoch seconds; None if
    unreadable."""
    if not isinstance(value, str) or not _TIMESTAMP.fullmatch(value.strip()):
        return None
    try:
        return datetime.fromisoformat(value.strip().replace("Z", "+00:00")).astimezone(UTC).timestamp()
    except ValueError:
        return None


def _device_count(value: Any) -> int:
    """Allocatable GPUs, bounded: one device record is made per GPU, so "1e18" must not be honoured."""
    gpus = count(value)
    if gpus > MAX_DEVICES_PER_NODE:
        raise ValueError(f"{value!r} GPUs: expected at most {MAX_DEVICES_PER_NODE} on one node")
    return gpus


def _devices_from_annotation(text, product, gpu_mem, node, problems) -> tuple[Device, ...] | None:
    accepted = 'a JSON list of {"index": int, "uuid": str, "product": str, "memoryMiB": int, "healthy": bool}'
    try:
        raw = json.loads(text)
        if not isinstance(raw, list):
            raise ValueError("not a list")
        devices = []
        seen = set()
        for entry in raw:
            if not isinstance(entry, dict) or "index" not in entry:
                raise ValueError(f"entry {entry!r} has no index")
            index = ascii_int(entry["index"])
            if index in seen or index < 0:
                raise ValueError(f"index {index} repeated or negative")
            seen.add(index)
            healthy = entry.get("healthy", True)
            devices.append(
                Device(
                    index=index,
                    uuid=str(entry.get("uuid", "") or ""),
                    product=str(entry.get("product") or product),
                    memory_mib=ascii_int(entry.get("memoryMiB") or gpu_mem or 0),
                    healthy=healthy if isinstance(healthy, bool) else _is_true(healthy),
                    utilization_pct=utilization_pct(entry.get("utilization")),
                )
            )
        return tuple(sorted(devices, key=lambda d: d.index))
    except (ValueError, TypeError, RecursionError) as err:  # RecursionError: "[[[[..." JSON
        if problems is not None:
            problems.append(
                f"node {node} annotation {DEVICES_ANNOTATION}={text[:200]!r} ignored ({err}); "
                f"accepted: {accepted}"
            )
        return None


# ---------------------------------------------------------------------------------------------- pods


@dataclass(frozen=True)
class PodRequests:
    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: int = 0


def _container_requests(container: dict, problems: list[str] | None, where: str) -> tuple[int, int, int]:
    resources = container.get("resources") or {}
    requests = dict(resources.get("limits") or {})  # requests default to limits, resource by resource
    requests.update(resources.get("requests") or {})
    cpu = _lenient(cpu_milli, requests.get("cpu"), 0, problems, f"{where} cpu")
    mem = _lenient(memory_mib, requests.get("memory"), 0, problems, f"{where} memory")
    gpus = _lenient(count, requests.get(GPU_RESOURCE), 0, problems, f"{where} {GPU_RESOURCE}")
    return cpu, mem, gpus


def _as_held(held: dict[str, dict[str, int]], container: dict, cpu: int, mem: int) -> tuple[int, int]:
    """A container's CPU and memory as its kubelet reports holding them, where it does."""
    sizes = held.get(container.get("name"))  # type: ignore[arg-type]
    if not sizes:
        return cpu, mem
    return sizes.get("cpu", cpu), sizes.get("memory", mem)


def as_resized(placement: Placement, pod: dict, problems: list[str] | None = None) -> Placement:
    """The placement a pod carries, holding the CPU and memory its kubelet reports the pod has where it was
    resized in place (gpuledger.core.pods.allocated); its devices and shares are the placement's, as GPUs
    cannot be resized."""
    if not resized(pod):
        return placement
    req = pod_requests(pod, problems)
    if (req.cpu_milli, req.memory_mib) == (placement.cpu_milli, placement.memory_mib):
        return placement
    return replace(placement, cpu_milli=req.cpu_milli, memory_mib=req.memory_mib)


def pod_requests(pod: dict, problems: list[str] | None = None) -> PodRequests:
    """Effective requests: sum of containers (and restartable init sidecars), max with each init container,
    or the pod-level `spec.resources` for CPU and memory where set, plus the pod overhead — the rule the
    scheduler uses. A container of a running pod holds the CPU and memory its kubelet reports it has
    (gpuledger.core.pods.allocated: a pod resized in place)."""
    spec = pod.get("spec") or {}
    name = (pod.get("metadata") or {}).get("name", "")
    held = allocated_sizes(pod, problems) if resized(pod) else {}
    cpu = mem = gpus = 0
    sidecar = [0, 0, 0]
    init_peak = [0, 0, 0]
    for c in spec.get("initContainers") or []:
        c_cpu, c_mem, c_gpu = _container_requests(c, problems, f"pod {name} init container {c.get('name')}")
        if held:
            c_cpu, c_mem = _as_held(held, c, c_cpu, c_mem)
        if c.get("restartPolicy") == "Always":
            sidecar = [sidecar[0] + c_cpu, sidecar[1] + c_mem, sidecar[2] + c_gpu]
        else:
            # an init container runs alongside the sidecars started before it
            init_peak = [
                max(init_peak[0], sidecar[0] + c_cpu),
                max(init_peak[1], sidecar[1] + c_mem),
                max(init_peak[2], sidecar[2] + c_gpu),
            ]
    for c in spec.get("containers") or []:
        c_cpu, c_mem, c_gpu = _container_requests(c, problems, f"pod {name} container {c.get('name')}")
        if held:
            c_cpu, c_mem = _as_held(held, c, c_cpu, c_mem)
        cpu, mem, gpus = cpu + c_cpu, mem + c_mem, gpus + c_gpu
    cpu, mem, gpus = cpu + sidecar[0], mem + sidecar[1], gpus + sidecar[2]
    cpu, mem, gpus = max(cpu, init_peak[0]), max(mem, init_peak[1]), max(gpus, init_peak[2])
    # pod-level resources: the pod's own CPU and memory, where set, stand for its containers' (the API server
    # defaults a pod-level request to its limit); GPUs are never pod-level
    level = spec.get("resources")
    if level and isinstance(level, dict):
        wanted = {}
        for section in ("limits", "requests"):  # requests win
            if isinstance(level.get(section), dict):
                wanted.update(level[section])
        if wanted.get("cpu") is not None:
            cpu = _lenient(cpu_milli, wanted["cpu"], cpu, problems, f"pod {name} spec.resources cpu")
        if wanted.get("memory") is not None:
            mem = _lenient(memory_mib, wanted["memory"], mem, problems, f"pod {name} spec.resources memory")
    overhead = spec.get("overhead") or {}
    cpu += _lenient(cpu_milli, overhead.get("cpu"), 0, problems, f"pod {name} overhead cpu")
    mem += _lenient(memory_mib, overhead.get("memory"), 0, problems, f"pod {name} overhead memory")
    return PodRequests(cpu, mem, gpus)


class PodUsage(NamedTuple):
    """What one pod holds, as the ledger needs it. A named tuple, not a dataclass: a rebuild makes one per
    stored pod and drops it at once, and a tuple is built in a fifth of the time."""

    key: str  # namespace/name (uid when nameless)
    node: str  # spec.nodeName, "" when not bound yet
    terminal: bool  # Succeeded or Failed: holds nothing
    cpu_milli: int
    memory_mib: int
    gpus: int  # nvidia.com/gpu requested (whole GPUs of unknown identity unless placed by gpuledger)
    placement: Placement | None  # a valid (signed) gpuledger placement, issued for this pod
    placement_problem: str = ""  # why a present placement annotation was not accepted
    unbound: Placement | None = None  # a validly signed placement issued for another pod (a copy)
    created: str = ""  # metadata.creationTimestamp (RFC 3339, so text order is time order)
    uid: str = ""


def pod_key(pod: dict) -> str:
    return pod_key_of(pod.get("metadata") or {})


def pod_key_of(meta: dict) -> str:
    """namespace/name, or uid:<uid> for a nameless pod, from its metadata (what `pod_usage` already holds)."""
    name = meta.get("name") or ""
    if not name:
        return f"uid:{meta.get('uid', '')}"
    return f"{meta.get('namespace') or 'default'}/{name}"


def pod_usage(
    pod: dict, key: bytes | str = b"", problems: list[str] | None = None, lazy: bool = False
) -> PodUsage:
    """What `pod` holds: its requests, its node, and its verified placement (if gpuledger placed it).

    `lazy=True` skips parsing the containers when nothing needs them (a terminal pod, or a valid placement,
    whose cpu/memory then stand in for the requests) — the ledger's rebuild path."""
    meta = pod.get("metadata") or {}
    spec = pod.get("spec") or {}
    status = pod.get("status") or {}
    terminal = status.get("phase") in TERMINAL_PHASES
    pod_id = pod_key_of(meta)
    placement = None
    problem = ""
    text = (meta.get("annotations") or {}).get(PLACEMENT_ANNOTATION)
    unbound = None
    if text is not None:
        decoded = decode_bound(text if type(text) is str else str(text), key)
        if decoded is None:
            problem = f"annotation {PLACEMENT_ANNOTATION} ignored: bad signature or malformed"
        else:
            placement, binding = decoded
            if not terminal:
                placement = as_resized(placement, pod, problems)
            mismatch = binding_mismatch(binding, pod) if binding is not None else ""
            if mismatch:
                unbound, placement = placement, None
                problem = f"annotation {PLACEMENT_ANNOTATION} was issued for another pod: {mismatch}"
        if problem and problems is not None:
            problems.append(f"pod {pod_id}: {problem}")
    if lazy and terminal:
        cpu = mem = gpus = 0
    elif lazy and (held := placement or unbound) is not None:
        cpu, mem, gpus = held.cpu_milli, held.memory_mib, len(held.devices)
    else:
        req = pod_requests(pod, problems)
        cpu, mem, gpus = req.cpu_milli, req.memory_mib, req.gpus
    node = spec.get("nodeName") or ""
    created = meta.get("creationTimestamp") or ""
    uid = meta.get("uid") or ""
    # positional, in the field order of PodUsage (a rebuild makes one per stored pod)
    return PodUsage(
        pod_id,
        node if type(node) is str else str(node),
        terminal,
        cpu,
        mem,
        gpus,
        placement,
        problem,
        unbound,
        created if type(created) is str else str(created),
        uid if type(uid) is str else str(uid),
    )


def natural_key(text: str) -> tuple:
    """Sort key that orders 'leaf-2' before 'leaf-10' (ASCII digits only: '٢' is text, not a number)."""
    return tuple(
        (0, int(part), "") if _DIGITS.fullmatch(part) else (1, 0, part)
        for part in _DIGITS.split(text)
        if part
    )


def split_objects(objects: Iterable[dict]) -> tuple[list[dict], list[dict]]:
    """(nodes, pods) from any mix of objects and Lists."""
    nodes, pods = [], []
    for obj in iter_objects(objects):
        kind = kind_of(obj)
        if kind == "Node":
            nodes.append(obj)
        elif kind == "Pod":
            pods.append(obj)
    return nodes, pods
