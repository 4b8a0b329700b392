"""GPU queues as the operator sees them: quota per product, used, borrowed, lendable, weight, parent,
namespaces, fair share, and the pods waiting for GPUs in the queue's namespaces.

Pure: API objects in (GPUQueues, Namespaces, Nodes, Pods), rows out. The figures are the core's, through
gpuledger.service.queue_standing, so they agree with what the ledger decides; this module only reads what
running pods hold (their placement annotations) and the waiting line (gpuledger.views.workloads), and lays
the answer out.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from gpuledger.names import PLACEMENT_ANNOTATION
from gpuledger.service.queue_standing import BucketStanding, Held, QueueStanding, Standing, standing
from gpuledger.views.inventory import TERMINAL_PHASES
from gpuledger.views.placement import MILLI_PER_GPU, placement_of_pod
from gpuledger.views.workloads import WorkloadRow, waiting_row, waiting_tickets


def gpus_of(milli: int) -> float | int:
    """Milli-GPUs as GPUs: whole where whole."""
    return milli // MILLI_PER_GPU if milli % MILLI_PER_GPU == 0 else round(milli / MILLI_PER_GPU, 3)


@dataclass
class QueueRow:
    standing: QueueStanding
    namespaces: list[str] = field(default_factory=list)  # every namespace of the queue, by name
    waiting: list[WorkloadRow] = field(default_factory=list)  # its pods waiting for GPUs, first in line first

    @property
    def name(self) -> str:
        return self.standing.name

    def as_dict(self) -> dict[str, Any]:
        s = self.standing
        return {
            "name": s.name,
            "parent": s.parent,
            "children": list(s.children),
            "weight": s.weight,
            "default": s.default,
            "implicit": s.implicit,
            "quota": s.quota_gpus,
            "used": gpus_of(s.used_milli),
            "borrowed": gpus_of(s.borrowed_milli),
            "lendable": gpus_of(s.lendable_milli),
            "share": round(s.share, 6),
            # JSON has no infinity: a queue using what it has no quota for says so with null
            "quotaUsed": None if math.isinf(s.quota_used) else round(s.quota_used, 6),
            "fairOrder": s.fair_order,
            "quotas": [bucket_dict(b) for b in s.buckets],
            "namespaces": self.namespaces,
            "waiting": [
                {
                    "namespace": r.namespace,
                    "name": r.name,
                    "position": r.queue_position,
                    "priority": r.priority,
                    "gpus": r.gpus,
                    "waitingFor": r.reason.removeprefix("waiting for "),
                    "created": r.created,
                }
                for r in self.waiting
            ],
        }


def bucket_dict(b: BucketStanding) -> dict[str, Any]:
    return {
        "product": b.product,
        "gpus": b.quota_gpus,
        "borrowingLimit": b.borrowing_limit,
        "lendingLimit": b.lending_limit,
        "used": gpus_of(b.used_milli),
        "borrowed": gpus_of(b.borrowed_milli),
        "lendable": gpus_of(b.lendable_milli),
    }


@dataclass
class QueuesView:
    rows: list[QueueRow]
    conflicts: dict[str, str]  # namespace -> why no single queue holds it (counted in the default queue)

    def as_dict(self) -> dict[str, Any]:
        return {
            "items": [r.as_dict() for r in self.rows],
            "conflicts": [{"namespace": ns, "message": m} for ns, m in sorted(self.conflicts.items())],
        }


def held_by_pods(pods: list[dict]) -> list[Held]:
    """What each live gpuledger-placed pod holds: its node's GPUs (whole and shares) and the CPU and memory
    its placement recorded."""
    out = []
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        placement = placement_of_pod(pod)
        if placement is None:
            continue
        meta = pod.get("metadata") or {}
        cpu, memory = _cpu_memory((meta.get("annotations") or {}).get(PLACEMENT_ANNOTATION, ""))
        milli = sum(m for _, m in placement.holdings())
        out.append(Held(meta.get("namespace", ""), placement.node, milli, cpu, memory))
    return out


def _cpu_memory(text: str) -> tuple[int, int]:
    """The placement's `cpu` (milli) and `mem` (MiB), 0 where absent or unreadable."""
    try:
        d = json.loads(text)
        return int(d.get("cpu") or 0), int(d.get("mem") or 0)
    except (ValueError, TypeError, AttributeError):
        return 0, 0


def namespace_labels(namespaces: list[dict]) -> dict[str, dict[str, str]]:
    return {
        (ns.get("metadata") or {}).get("name", ""): dict((ns.get("metadata") or {}).get("labels") or {})
        for ns in namespaces
    }


def queues_view(
    gpu_queues: list[dict], namespaces: list[dict], nodes: list[dict], pods: list[dict]
) -> QueuesView:
    """Every queue's standing and waiting pods. Raises gpuledger.service.queue_standing.QueueError when the
    GPUQueues cannot be honoured as a whole (a missing parent, two default queues)."""
    labels = namespace_labels(namespaces)
    for pod in pods:  # a pod's namespace the listing did not return still belongs somewhere
        labels.setdefault((pod.get("metadata") or {}).get("namespace", ""), {})
    found: Standing = standing(gpu_queues, labels, nodes, held_by_pods(pods))
    rows = {q.name: QueueRow(q) for q in found.queues}
    for namespace, queue in sorted(found.queue_of_namespace.items()):
        rows[queue].namespaces.append(namespace)
    line = waiting_tickets(pods)
    by_key = {
        ((p.get("metadata") or {}).get("namespace", ""), (p.get("metadata") or {}).get("name", "")): p
        for p in pods
    }
    for (namespace, name), (position, ticket) in sorted(line.items(), key=lambda kv: kv[1][0]):
        holder = found.queue_of_namespace.get(namespace)
        if holder is not None:
            rows[holder].waiting.append(waiting_row(by_key[(namespace, name)], position, ticket))
    return QueuesView(list(rows.values()), dict(found.conflicts))
