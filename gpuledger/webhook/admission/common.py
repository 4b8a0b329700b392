"""What both admission sides read off a pod and how they word a placement or a denial: the pod's
annotations, labels and gpuledger.io/* keys, its name for messages, the 403 every refusal uses and the 422
of settings that cannot be accepted.
Pure functions of their arguments; never asks the ledger, never changes the pod.
"""

from __future__ import annotations

from typing import Any

from gpuledger.core.model import Placement
from gpuledger.names import LEDGER_PREFIX, SCHEDULING_GATE
from gpuledger.webhook.admission.patch import _dict_at
from gpuledger.webhook.admission.review import Decision, Review


def _annotations(obj: dict | None) -> dict:
    meta = (obj or {}).get("metadata")
    value = meta.get("annotations") if isinstance(meta, dict) else None
    return value if isinstance(value, dict) else {}


def _labels(obj: dict | None) -> dict:
    meta = (obj or {}).get("metadata")
    value = meta.get("labels") if isinstance(meta, dict) else None
    return value if isinstance(value, dict) else {}


# what a user may not change on a pod waiting for GPUs (gpuledger's gate on): where its placement will go
WAITING_SPEC = ("nodeSelector", "affinity", "tolerations")


def _ledger_keys(obj: dict | None) -> dict[str, object]:
    """What only gpuledger writes on a pod: gpuledger.io/* annotations and labels, its scheduling gate, and,
    while the pod waits gated, what the placement adapter writes with its placement."""
    keys = {f"annotation {k}": v for k, v in _annotations(obj).items() if str(k).startswith(LEDGER_PREFIX)}
    keys.update({f"label {k}": v for k, v in _labels(obj).items() if str(k).startswith(LEDGER_PREFIX)})
    spec = _dict_at(obj or {}, "spec")
    gates = spec.get("schedulingGates")
    ours = {"name": SCHEDULING_GATE}
    if isinstance(gates, list) and any(isinstance(g, dict) and g.get("name") == ours["name"] for g in gates):
        keys[f"scheduling gate {SCHEDULING_GATE}"] = True
        keys.update({f"spec.{k} of a pod waiting for GPUs": spec.get(k) for k in WAITING_SPEC})
    return keys


def _pod_name(review: Review, pod: dict) -> str:
    meta = _dict_at(pod, "metadata")
    name = (
        review.name
        or meta.get("name")
        or (f"{meta.get('generateName')}<generated>" if meta.get("generateName") else "<unnamed>")
    )
    return f"pod {review.namespace or meta.get('namespace') or 'default'}/{name}"


def describe_placement(p: Placement) -> str:
    devices = (
        ",".join(map(str, p.devices)) if p.devices else ",".join(f"{s.device}({s.milli}m)" for s in p.shares)
    )
    group = f" group {p.group} slot {p.slot}" if p.group else ""
    return f"node {p.node} devices [{devices}] by {p.strategy or 'default'}{group}"


def describe_event(p: Placement) -> str:
    """The GPUPlaced Event's message: node, devices, strategy, gang slot, reservation."""
    devices = (
        ",".join(map(str, p.devices)) if p.devices else ",".join(f"{s.device}({s.milli}m)" for s in p.shares)
    )
    uuids = f" ({','.join(p.uuids)})" if p.uuids and all(p.uuids) else ""
    group = f", gang {p.group} slot {p.slot}" if p.group else ""
    return (
        f"gpuledger placed the pod on node {p.node}, GPU devices [{devices}]{uuids}, strategy "
        f"{p.strategy or 'default'}{group}, reservation {p.id}"
    )


def _forbidden(message: str, **fields: Any) -> Decision:
    """A denial of what the pod asks (403); `fields`: more of the Decision (strategy, ledger batch)."""
    return Decision(
        False, code=403, reason="Forbidden", outcome="denied", message=f"gpuledger: {message}", **fields
    )


def _invalid(message: str) -> Decision:
    """A pod whose own settings cannot be accepted as written (422): an annotation, a mode it needs."""
    return Decision(False, code=422, reason="Invalid", outcome="invalid", message=f"gpuledger: {message}")


def _bad_request(message: str) -> Decision:
    """A review the webhook cannot read (400): the API server sent something malformed, not the user."""
    return Decision(False, code=400, reason="BadRequest", outcome="invalid", message=message)


MISSING_OBJECT = "AdmissionReview request.object is missing or not an object"
