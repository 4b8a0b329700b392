"""GPUWorkloads (either API group), gpuledger-placed pods and pods waiting for GPUs as rows: phase, GPUs,
node, devices, queue.

Pure: API objects in, rows out. A GPUWorkload's status is the operator's (phase, assignedNodes, devices,
attempts, queuePosition, reason); a pod's node and devices come from its placement annotation; a waiting
pod's place in line from the tickets of every waiting pod, in the ledger's own order (the line is a function
of those pods: gpuledger.service.ledger_service's queue_order).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from gpuledger.core.pods.waiting_codec import WaitTicket, decode_waiting
from gpuledger.core.queues.queue_rule import Entry as QueueEntry
from gpuledger.core.queues.queue_rule import order as queue_order
from gpuledger.core.queues.waiting import wants
from gpuledger.names import SCHEDULING_GATE, WAITING_ANNOTATION
from gpuledger.views.placement import placement_of_pod

# the operator's phases, in the order a workload normally passes them
PHASES = ("Pending", "Queued", "Placing", "Running", "Retrying", "Succeeded", "Failed")
PRIORITY_WORDS = {"low": -100, "medium": 0, "high": 100, "critical": 1000}


@dataclass
class WorkloadRow:
    kind: str  # GPUWorkload | Pod
    namespace: str
    name: str
    phase: str
    gpus: str = ""
    priority: str = ""
    nodes: list[str] = field(default_factory=list)
    devices: str = ""
    attempts: int | None = None
    queue_position: int | None = None
    reason: str = ""
    message: str = ""
    api_version: str = "v1"
    strategy: str = ""
    owner: str = ""
    created: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "apiVersion": self.api_version,
            "namespace": self.namespace,
            "name": self.name,
            "phase": self.phase,
            "gpus": self.gpus,
            "priority": self.priority,
            "nodes": self.nodes,
            "devices": self.devices,
            "attempts": self.attempts,
            "queuePosition": self.queue_position,
            "reason": self.reason,
            "message": self.message,
            "strategy": self.strategy,
            "owner": self.owner,
            "created": self.created,
        }


def priority_value(priority: Any) -> int:
    """A workload's priority as a number: an integer, or low/medium/high/critical (GPU_Orchestrator's)."""
    if isinstance(priority, str) and priority.strip().lower() in PRIORITY_WORDS:
        return PRIORITY_WORDS[priority.strip().lower()]
    try:
        return int(priority)
    except (TypeError, ValueError):
        return 0


def gpu_count(spec: dict) -> str:
    """gpuCount (gpu.warp.dev) or gpuRequirements.gpuCount (agentaflow.io), times parallelism when set."""
    count = spec.get("gpuCount")
    if count is None:
        count = (spec.get("gpuRequirements") or {}).get("gpuCount")
    if count is None:
        return ""
    parallelism = spec.get("parallelism")
    return f"{parallelism}x{count}" if parallelism and parallelism != 1 else str(count)


def _devices_text(devices: Any) -> str:
    """status.devices as `node:0,1`: accepts strings, indices, or {node, index|indices|uuid} entries."""
    if not devices:
        return ""
    parts = []
    for d in devices if isinstance(devices, list) else [devices]:
        if isinstance(d, dict):
            idx = d.get("indices", d.get("devices", d.get("index", d.get("uuid", ""))))
            idx = ",".join(map(str, idx)) if isinstance(idx, list) else str(idx)
            parts.append(f"{d['node']}:{idx}" if d.get("node") else idx)
        else:
            parts.append(str(d))
    return " ".join(parts)


def workload_row(obj: dict) -> WorkloadRow:
    meta, spec, status = obj.get("metadata") or {}, obj.get("spec") or {}, obj.get("status") or {}
    nodes = status.get("assignedNodes") or ([status["assignedNode"]] if status.get("assignedNode") else [])
    return WorkloadRow(
        kind="GPUWorkload",
        api_version=obj.get("apiVersion", ""),
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        phase=status.get("phase") or "Pending",
        gpus=gpu_count(spec),
        priority=str(spec.get("priority", "")),
        nodes=list(nodes),
        devices=_devices_text(status.get("devices")),
        attempts=status.get("attempts"),
        queue_position=status.get("queuePosition"),
        reason=str(status.get("reason") or ""),
        message=str(status.get("message") or ""),
        strategy=str(spec.get("schedulingStrategy") or ""),
        created=meta.get("creationTimestamp", ""),
    )


def pod_row(pod: dict) -> WorkloadRow | None:
    """A row for a gpuledger-placed pod; None for any other pod."""
    placement = placement_of_pod(pod)
    if placement is None:
        return None
    meta = pod.get("metadata") or {}
    owners = (
        [o for o in meta.get("ownerReferences") or () if o.get("controller")]
        or meta.get("ownerReferences")
        or []
    )
    owner = f"{owners[0].get('kind')}/{owners[0].get('name')}" if owners else ""
    return WorkloadRow(
        kind="Pod",
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        phase=(pod.get("status") or {}).get("phase") or "Pending",
        gpus=str(len(placement.devices) + len(placement.shares)),
        nodes=[placement.node],
        devices=placement.describe_devices(),
        strategy=placement.strategy,
        owner=owner,
        created=meta.get("creationTimestamp", ""),
    )


WAITING = "Waiting"  # the phase shown for a pod waiting in line (kubectl shows it SchedulingGated)


def waiting_tickets(pods: list[dict]) -> dict[tuple[str, str], tuple[int, WaitTicket]]:
    """(namespace, name) -> (place in line, ticket) of every pod waiting for GPUs: gated by gpuledger, with a
    ticket (read, not verified: the CLI holds no key; the ledger verifies), in the ledger's order."""
    found: list[tuple[tuple[str, str], WaitTicket]] = []
    for pod in pods:
        meta = pod.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(WAITING_ANNOTATION)
        gates = (pod.get("spec") or {}).get("schedulingGates") or []
        if text is None or not any(isinstance(g, dict) and g.get("name") == SCHEDULING_GATE for g in gates):
            continue
        ticket = decode_waiting(text)
        if ticket is not None:
            found.append(((meta.get("namespace", ""), meta.get("name", "")), ticket))
    by_id = {t.request.id: (key, t) for key, t in found}
    entries = [QueueEntry(t.request.id, t.request.priority, t.arrival) for _, t in found]
    return {by_id[e.key][0]: (n + 1, by_id[e.key][1]) for n, e in enumerate(queue_order(entries))}


def waiting_row(pod: dict, position: int, ticket: WaitTicket) -> WorkloadRow:
    meta = pod.get("metadata") or {}
    owners = [o for o in meta.get("ownerReferences") or () if o.get("controller")]
    req = ticket.request
    return WorkloadRow(
        kind="Pod",
        namespace=meta.get("namespace", ""),
        name=meta.get("name", ""),
        phase=WAITING,
        gpus=str(req.gpus) if req.gpus else "share",
        priority=str(req.priority),
        queue_position=position,
        reason=f"waiting for {wants(req)}",
        strategy=req.strategy or "",
        owner=f"{owners[0].get('kind')}/{owners[0].get('name')}" if owners else "",
        created=meta.get("creationTimestamp", ""),
    )


def workload_rows(
    gpu_workloads: list[dict], pods: list[dict], everyone: list[dict] | None = None
) -> list[WorkloadRow]:
    """GPUWorkloads first (by namespace, name), then placed and waiting pods. `everyone`: every pod of the
    cluster (default `pods`), for waiting pods' places in the one line."""
    rows = sorted((workload_row(o) for o in gpu_workloads), key=lambda r: (r.namespace, r.name))
    line = waiting_tickets(pods if everyone is None else everyone)
    pod_rows = []
    for p in pods:
        meta = p.get("metadata") or {}
        place = line.get((meta.get("namespace", ""), meta.get("name", "")))
        row = waiting_row(p, *place) if place is not None else pod_row(p)
        if row is not None:
            pod_rows.append(row)
    return rows + sorted(pod_rows, key=lambda r: (r.namespace, r.name))


def waiting_line(rows: list[WorkloadRow]) -> list[WorkloadRow]:
    """The pods waiting for GPUs, first in line first."""
    return sorted((r for r in rows if r.phase == WAITING), key=lambda r: r.queue_position or 0)


def queue(rows: list[WorkloadRow]) -> list[WorkloadRow]:
    """Queued GPUWorkloads in the operator's order (queuePosition), else priority then age."""
    waiting = [r for r in rows if r.kind == "GPUWorkload" and r.phase == "Queued"]
    return sorted(
        waiting,
        key=lambda r: (
            r.queue_position if r.queue_position is not None else 1 << 30,
            -priority_value(r.priority),
            r.created,
        ),
    )


def phase_counts(rows: list[WorkloadRow]) -> dict[str, int]:
    counts = dict.fromkeys(PHASES, 0)
    for r in rows:
        if r.kind == "GPUWorkload":
            counts[r.phase] = counts.get(r.phase, 0) + 1
    return counts


def age(created: str, now: datetime) -> str:
    """kubectl's age: 45s, 12m, 3h, 5d."""
    if not created:
        return ""
    try:
        seconds = int((now - datetime.fromisoformat(created.replace("Z", "+00:00"))).total_seconds())
    except ValueError:
        return ""
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "m" else 1):
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"
