"""Placement -> the mutated pod -> an RFC 6902 patch of the members written (so unknown fields survive).

Only the parts we change are copied (copy-on-write), the rest of the mutated pod shares the original's
objects; `patch_of` then compares only the members this module writes.
"""

from __future__ import annotations

from typing import Any

from gpuledger.names import (
    DEVICE_INDICES_ANNOTATION,
    GPU_RESOURCE,
    HOSTNAME_LABEL,
    LEDGER_PREFIX,
    PLACEMENT_ANNOTATION,
    RESERVATION_ID_KEY,
    SCHEDULING_GATE,
    VISIBLE_DEVICES_ANNOTATION,
    WAITING_ANNOTATION,
)
from gpuledger.service.ledger_service import BindingMode, Placement, Request, Taint

CUDA_VISIBLE_DEVICES = "CUDA_VISIBLE_DEVICES"
NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
VISIBILITY_VARS = (CUDA_VISIBLE_DEVICES, NVIDIA_VISIBLE_DEVICES)
CONTAINER_KINDS = ("initContainers", "containers")
# a waiting pod's device variables, read by the kubelet from the annotations the placement adapter writes
# with its placement (gpuledger.sync.placer) when the container starts: after the gate is removed
# (apiVersion written as the API server defaults it, so the stored pod reads back as written)
VISIBLE_DEVICES_FROM = {
    "fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{VISIBLE_DEVICES_ANNOTATION}']"}
}
DEVICE_INDICES_FROM = {
    "fieldRef": {"apiVersion": "v1", "fieldPath": f"metadata.annotations['{DEVICE_INDICES_ANNOTATION}']"}
}


def _dict_at(parent: dict, key: str) -> dict:
    """parent[key] if it is a mapping, else an empty one: a pod from the API may hold anything there."""
    value = parent.get(key)
    return value if isinstance(value, dict) else {}


def _list_at(parent: dict, key: str) -> list:
    """parent[key] if it is a list, else an empty one."""
    value = parent.get(key)
    return value if isinstance(value, list) else []


def _copy_dict(parent: dict, key: str) -> dict:
    value = parent.get(key)
    copied = dict(value) if isinstance(value, dict) else {}
    parent[key] = copied
    return copied


def shallow_pod(pod: dict) -> dict:
    """A copy whose metadata and spec may be mutated without touching `pod`."""
    out = dict(pod)
    _copy_dict(out, "metadata")
    if isinstance(pod.get("spec"), dict):
        _copy_dict(out, "spec")
    return out


def strip_ledger_keys(pod: dict) -> list[str]:
    """Remove every gpuledger.io/* annotation and label and gpuledger's scheduling gate (only the webhook
    writes them); returns what went."""
    removed = []
    meta = pod["metadata"]
    for field in ("annotations", "labels"):
        values = meta.get(field)
        if isinstance(values, dict) and any(str(k).startswith(LEDGER_PREFIX) for k in values):
            kept = {k: v for k, v in values.items() if not str(k).startswith(LEDGER_PREFIX)}
            removed += [f"{field[:-1]} {k}" for k in values if str(k).startswith(LEDGER_PREFIX)]
            meta[field] = kept
    spec = pod.get("spec")
    if isinstance(spec, dict):
        gates = spec.get("schedulingGates")
        if isinstance(gates, list) and any(is_our_gate(g) for g in gates):
            others = [g for g in gates if not is_our_gate(g)]
            if others:
                spec["schedulingGates"] = others
            else:
                del spec["schedulingGates"]
            removed.append(f"scheduling gate {SCHEDULING_GATE}")
    return removed


def is_our_gate(gate: Any) -> bool:
    return isinstance(gate, dict) and gate.get("name") == SCHEDULING_GATE


def gated(pod: dict) -> bool:
    """Whether the pod carries gpuledger's scheduling gate."""
    return any(is_our_gate(g) for g in _list_at(_dict_at(pod, "spec"), "schedulingGates"))


def gpu_containers(pod: dict, resource: str) -> list[tuple[str, int]]:
    """(kind, index) of the containers that get the devices: those with a GPU limit, else every container."""
    spec = _dict_at(pod, "spec")
    with_limit, every = [], []
    for kind in CONTAINER_KINDS:
        containers = spec.get(kind)
        if not isinstance(containers, list):
            continue
        for i, c in enumerate(containers):
            if not isinstance(c, dict):
                continue
            every.append((kind, i))
            res = _dict_at(c, "resources")
            limits = _dict_at(res, "limits")
            requests = _dict_at(res, "requests")
            value = limits.get(resource, requests.get(resource))
            if value not in (None, 0, "0"):
                with_limit.append((kind, i))
    return with_limit or every


def _container(spec: dict, kind: str, index: int) -> dict:
    containers = list(spec[kind])
    spec[kind] = containers
    c = dict(containers[index])
    containers[index] = c
    return c


def _set_env(container: dict, values: dict[str, Any]) -> None:
    """Overwrite (or remove, for None) these variables; user-supplied values never survive. A value is text,
    or a dict: the entry's `valueFrom`."""
    env = _list_at(container, "env")
    kept = [e for e in env if not (isinstance(e, dict) and e.get("name") in values)]
    for k, v in values.items():
        if isinstance(v, dict):
            kept.append({"name": k, "valueFrom": v})
        elif v is not None:
            kept.append({"name": k, "value": v})
    if kept or "env" in container:
        container["env"] = kept


def visibility_env(placement: Placement, mode: str) -> dict[str, str | None]:
    """The variables each GPU container gets, per visibility mode (see docs/webhook.md)."""
    indices = list(placement.devices) + [s.device for s in placement.shares]
    if mode == "host-indices":
        # physical indices are only true if the runtime exposes every GPU of the node to the container
        return {NVIDIA_VISIBLE_DEVICES: "all", CUDA_VISIBLE_DEVICES: ",".join(map(str, indices))}
    if mode == "runtime-uuids":
        known = placement.uuids if len(placement.uuids) == len(indices) and all(placement.uuids) else None
        # the runtime mounts exactly these GPUs; inside, CUDA numbers them from 0
        runtime = ",".join(known) if known else ",".join(map(str, indices))
        return {
            NVIDIA_VISIBLE_DEVICES: runtime,
            CUDA_VISIBLE_DEVICES: ",".join(str(i) for i in range(len(indices))),
        }
    # device-plugin: the kubelet's device plugin picks the devices and sets the runtime's variable itself;
    # a user's CUDA_VISIBLE_DEVICES indexes what the plugin exposes, so it stays (env_guard.py)
    return {NVIDIA_VISIBLE_DEVICES: None}


def _tolerates(existing: list, taint: Taint) -> bool:
    for t in existing:
        if not isinstance(t, dict):
            continue
        if t.get("effect") and t.get("effect") != taint.effect:
            continue
        op = t.get("operator") or "Equal"
        if op == "Exists" and (not t.get("key") or t.get("key") == taint.key):
            return True
        if op == "Equal" and t.get("key") == taint.key and (t.get("value") or "") == taint.value:
            return True
    return False


def _add_tolerations(spec: dict, taints: tuple[Taint, ...]) -> None:
    existing = _list_at(spec, "tolerations")
    added = list(existing)
    for taint in taints:
        if _tolerates(added, taint):
            continue
        tol: dict[str, Any] = {"key": taint.key}
        if taint.value:
            tol.update(operator="Equal", value=taint.value)
        else:
            tol["operator"] = "Exists"
        if taint.effect:
            tol["effect"] = taint.effect
        added.append(tol)
    if len(added) != len(existing):
        spec["tolerations"] = added


def _add_node_affinity(spec: dict, node: str, key: str) -> None:
    """AND `node` into every required term (terms are ORed; the ledger chose a node matching one of them)."""
    affinity = _copy_dict(spec, "affinity")
    node_affinity = _copy_dict(affinity, "nodeAffinity")
    required = _copy_dict(node_affinity, "requiredDuringSchedulingIgnoredDuringExecution")
    terms = _list_at(required, "nodeSelectorTerms")
    field = "matchFields" if key == "metadata.name" else "matchExpressions"
    requirement = {"key": key, "operator": "In", "values": [node]}
    new_terms = []
    for term in terms or [{}]:
        term = dict(term) if isinstance(term, dict) else {}
        reqs = _list_at(term, field)
        if requirement not in reqs:  # a reinvocation finds it already there
            term[field] = [*reqs, requirement]
        new_terms.append(term)
    required["nodeSelectorTerms"] = new_terms


def _ensure_gpu_limits(spec: dict, resource: str, gpus: int) -> None:
    """device-plugin mode with a count from annotations only: ask the kubelet for the devices on
    container 0."""
    containers = spec.get("containers")
    if not gpus or not isinstance(containers, list) or not containers:
        return
    for kind in CONTAINER_KINDS:
        for c in spec.get(kind) or []:
            res = _dict_at(c, "resources") if isinstance(c, dict) else {}
            if resource in (res.get("limits") or {}) or resource in (res.get("requests") or {}):
                return
    c = _container(spec, "containers", 0)
    resources = _copy_dict(c, "resources")
    limits = _copy_dict(resources, "limits")
    limits[resource] = str(gpus)


def waiting_env(request: Request, mode: str) -> dict[str, Any]:
    """The variables each GPU container of a waiting pod gets, per visibility mode: what depends on the
    devices is read by the kubelet from the placement's annotations when the container starts (the env was
    written now, before any placement); the rest is as `visibility_env` writes it."""
    count = max(request.gpus, 1 if request.is_shared else 0)
    if mode == "host-indices":
        return {NVIDIA_VISIBLE_DEVICES: "all", CUDA_VISIBLE_DEVICES: DEVICE_INDICES_FROM}
    if mode == "runtime-uuids":
        return {
            NVIDIA_VISIBLE_DEVICES: VISIBLE_DEVICES_FROM,
            CUDA_VISIBLE_DEVICES: ",".join(str(i) for i in range(count)),
        }
    return {NVIDIA_VISIBLE_DEVICES: None}


def apply_waiting(
    pod: dict,
    request: Request,
    ticket: str,
    *,
    visibility_mode: str,
    gpu_resource: str = GPU_RESOURCE,
) -> None:
    """Admit `pod` (a `shallow_pod` copy, already stripped of gpuledger.io keys) to wait for GPUs: its signed
    ticket (`ticket`, the `gpuledger.io/waiting` annotation), gpuledger's scheduling gate, and the device
    variables of `waiting_env`. Nothing names a node yet: the placement adapter writes that later."""
    annotations = _copy_dict(pod["metadata"], "annotations")
    annotations[WAITING_ANNOTATION] = ticket
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        spec = pod["spec"] = {}
    spec["schedulingGates"] = [*_list_at(spec, "schedulingGates"), {"name": SCHEDULING_GATE}]
    targets = gpu_containers(pod, gpu_resource)
    if visibility_mode == "device-plugin":
        _ensure_gpu_limits(spec, gpu_resource, request.gpus)
    env = waiting_env(request, visibility_mode)
    for kind, i in targets:
        _set_env(_container(spec, kind, i), env)
    if visibility_mode == "runtime-uuids":
        _void_others(spec, targets)


def _void_others(spec: dict, targets: list[tuple[str, int]]) -> None:
    """Other containers of a GPU pod must not inherit an image default such as NVIDIA_VISIBLE_DEVICES=all."""
    chosen = set(targets)
    for kind in CONTAINER_KINDS:
        for i, c in enumerate(spec.get(kind) or []):
            if (kind, i) not in chosen and isinstance(c, dict):
                _set_env(
                    _container(spec, kind, i), {NVIDIA_VISIBLE_DEVICES: "void", CUDA_VISIBLE_DEVICES: None}
                )


def apply_placement(
    pod: dict,
    placement: Placement,
    annotation: str,
    *,
    binding_mode: BindingMode,
    visibility_mode: str,
    affinity_key: str = HOSTNAME_LABEL,
    gpu_resource: str = GPU_RESOURCE,
) -> None:
    """Write `placement` into `pod` (a `shallow_pod` copy, already stripped of gpuledger.io keys)."""
    meta = pod["metadata"]
    annotations = _copy_dict(meta, "annotations")
    annotations[PLACEMENT_ANNOTATION] = annotation
    labels = _copy_dict(meta, "labels")
    labels[RESERVATION_ID_KEY] = placement.id
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        spec = pod["spec"] = {}
    if binding_mode in (BindingMode.NODE_NAME, BindingMode.BOTH):
        spec["nodeName"] = placement.node
    if binding_mode in (BindingMode.AFFINITY, BindingMode.BOTH):
        _add_node_affinity(spec, placement.node, affinity_key)
    if placement.tolerated_taints:
        _add_tolerations(spec, placement.tolerated_taints)
    targets = gpu_containers(pod, gpu_resource)
    if visibility_mode == "device-plugin":
        _ensure_gpu_limits(spec, gpu_resource, len(placement.devices))
    env = visibility_env(placement, visibility_mode)
    for kind, i in targets:
        _set_env(_container(spec, kind, i), env)
    if visibility_mode == "runtime-uuids":
        _void_others(spec, targets)


def _escape(token: Any) -> str:
    token = str(token)
    return token.replace("~", "~0").replace("/", "~1") if "~" in token or "/" in token else token


_MISSING: Any = object()
# Every member the mutating path writes (strip_ledger_keys, scheduler_name.take_over, apply_placement): the
# patch compares these and nothing else. tests/webhook/test_webhook_fuzz.py checks, on random pods through
# every mode, that the patch turns the original into the mutated pod exactly.
SPEC_MEMBERS = ("schedulerName", "nodeName", "affinity", "tolerations", "schedulingGates")
CONTAINER_MEMBERS = ("env", "resources")


def patch_of(original: dict, work: dict) -> list[dict]:
    """RFC 6902 ops turning `original` into `work`, its `shallow_pod` copy as this module wrote it.

    Built from what the mutating path can change (`add` for a new member, `replace` for a changed one,
    `remove`), compared by identity first (copy-on-write leaves untouched
    subtrees shared) and by value second, so a reinvocation that writes the same placement gets no ops. No
    whole-object diff: diffing the pod was the largest part of an admission's CPU before.
    """
    ops: list[dict] = []
    if work is original:
        return ops
    old_meta, new_meta = original.get("metadata", _MISSING), work.get("metadata", _MISSING)
    if new_meta is not old_meta:
        if isinstance(old_meta, dict) and isinstance(new_meta, dict):
            for field in ("annotations", "labels"):
                _mapping_ops(old_meta, new_meta, field, f"/metadata/{field}", ops)
        else:
            _member_op(original, work, "metadata", "/metadata", ops)
    old_spec, new_spec = original.get("spec", _MISSING), work.get("spec", _MISSING)
    if new_spec is old_spec:
        return ops
    if not (isinstance(old_spec, dict) and isinstance(new_spec, dict)):
        _member_op(original, work, "spec", "/spec", ops)
        return ops
    for key in SPEC_MEMBERS:
        _member_op(old_spec, new_spec, key, f"/spec/{key}", ops)
    for kind in CONTAINER_KINDS:
        old, new = old_spec.get(kind), new_spec.get(kind)
        if new is old:
            continue
        if not (isinstance(old, list) and isinstance(new, list) and len(old) == len(new)):
            _member_op(old_spec, new_spec, kind, f"/spec/{kind}", ops)
            continue
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            if a is b:
                continue
            if isinstance(a, dict) and isinstance(b, dict):
                for key in CONTAINER_MEMBERS:
                    _member_op(a, b, key, f"/spec/{kind}/{i}/{key}", ops)
            elif a != b:
                ops.append({"op": "replace", "path": f"/spec/{kind}/{i}", "value": b})
    return ops


def _member_op(old: dict, new: dict, key: str, path: str, ops: list[dict]) -> None:
    """`add` when new[key] is new, `replace` when it differs, `remove` when it went."""
    value = new.get(key, _MISSING)
    before = old.get(key, _MISSING)
    if value is before:
        return
    if value is _MISSING:
        ops.append({"op": "remove", "path": path})
    elif before is _MISSING:
        ops.append({"op": "add", "path": path, "value": value})
    elif before != value:
        ops.append({"op": "replace", "path": path, "value": value})


def _mapping_ops(old_meta: dict, new_meta: dict, field: str, path: str, ops: list[dict]) -> None:
    """Annotations and labels key by key (the whole map would repeat e.g. kubectl's last-applied copy)."""
    old, new = old_meta.get(field, _MISSING), new_meta.get(field, _MISSING)
    if new is old:
        return
    if not (isinstance(old, dict) and isinstance(new, dict)):
        _member_op(old_meta, new_meta, field, path, ops)
        return
    for key in old:
        if key not in new:
            ops.append({"op": "remove", "path": f"{path}/{_escape(key)}"})
    for key, value in new.items():
        before = old.get(key, _MISSING)
        if before is _MISSING:
            ops.append({"op": "add", "path": f"{path}/{_escape(key)}", "value": value})
        elif before is not value and before != value:
            ops.append({"op": "replace", "path": f"{path}/{_escape(key)}", "value": value})
