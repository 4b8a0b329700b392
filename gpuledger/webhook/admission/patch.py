"""What the webhook writes onto a pod it admits: the placement (or the waiting ticket and gate), through the
pod-write layer (gpuledger.podwrite) onto a copy-on-write copy, and the RFC 6902 patch of the members
written (so unknown fields survive).

Only the parts written are copied, the rest of the mutated pod shares the original's objects; `patch_of`
then compares only the members written.
"""

from __future__ import annotations

from gpuledger.core.model import BindingMode, Placement, Request
from gpuledger.names import (
    GPU_RESOURCE,
    HOSTNAME_LABEL,
    LEDGER_PREFIX,
    PLACEMENT_ANNOTATION,
    RESERVATION_ID_KEY,
    SCHEDULING_GATE,
    WAITING_ANNOTATION,
)
from gpuledger.podwrite import affinity, tolerations, visibility
from gpuledger.podwrite.copy_on_write import copied, dict_at, list_at
from gpuledger.podwrite.copy_on_write import shallow_pod as shallow_pod
from gpuledger.podwrite.diff import patch_of as patch_of
from gpuledger.podwrite.gate import index_of
from gpuledger.podwrite.gate import is_ours as is_our_gate
from gpuledger.podwrite.visibility.host_indices import DEVICE_INDICES_FROM as DEVICE_INDICES_FROM
from gpuledger.podwrite.visibility.runtime_uuids import VISIBLE_DEVICES_FROM as VISIBLE_DEVICES_FROM

# what the admission modules (and tests) read through this module, by the names they had here
_dict_at = dict_at
visibility_env = visibility.placed_env
waiting_env = visibility.waiting_env


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


def gated(pod: dict) -> bool:
    """Whether the pod carries gpuledger's scheduling gate."""
    return index_of(pod) is not None


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
    variables of its visibility mode. Nothing names a node yet: the placement adapter writes that later."""
    annotations = copied(pod["metadata"], "annotations")
    annotations[WAITING_ANNOTATION] = ticket
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        spec = pod["spec"] = {}
    spec["schedulingGates"] = [*list_at(spec, "schedulingGates"), {"name": SCHEDULING_GATE}]
    visibility.write_waiting(pod, request, visibility_mode, gpu_resource)


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
    """Write `placement` into `pod` (a `shallow_pod` copy, already stripped of gpuledger.io keys): the signed
    annotation, the reservation label, the node as `binding_mode` says, the tolerations its node's taints
    need, and the device variables of its visibility mode."""
    meta = pod["metadata"]
    annotations = copied(meta, "annotations")
    annotations[PLACEMENT_ANNOTATION] = annotation
    labels = copied(meta, "labels")
    labels[RESERVATION_ID_KEY] = placement.id
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        spec = pod["spec"] = {}
    affinity.bind(spec, placement.node, binding_mode, affinity_key)
    if placement.tolerated_taints:
        existing = list_at(spec, "tolerations")
        added = tolerations.missing(existing, placement.tolerated_taints)
        if added:
            spec["tolerations"] = [*existing, *added]
    visibility.write_placed(pod, placement, visibility_mode, gpu_resource)
