"""The cluster's GPUs as the CLI shows them: nodes, devices, who holds each, totals per leaf and overall.

Built from GPUNode objects (what the controller published from the ledger), or from Node objects (the node
agent's `agentaflow.gpu/*` annotations) and the placement annotations of gpuledger-placed pods; which of the
two a command shows is gpuledger.views.freshness's choice. Pure: API objects in, views out; figures follow
the ledger's own definitions (gpuledger/core/stats.py) so the two agree.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from gpuledger.names import (
    DEVICES_ANNOTATION,
    GPU_RESOURCE,
    LAST_UPDATE_ANNOTATION,
    LEAF_LABEL,
    NODE_STATUS_ANNOTATION,
    SCHEDULABLE_LABEL,
    SPINE_LABEL,
)
from gpuledger.views.placement import MILLI_PER_GPU, placement_of_pod

TERMINAL_PHASES = ("Succeeded", "Failed")


def parse_time(text: str) -> datetime | None:
    """An RFC 3339 time as the API and the node agent write it (UTC when it names no zone); None when absent
    or unreadable."""
    try:
        parsed = datetime.fromisoformat(text.replace("Z", "+00:00")) if text else None
    except ValueError:
        return None
    return parsed.replace(tzinfo=UTC) if parsed and parsed.tzinfo is None else parsed


@dataclass(frozen=True)
class Holder:
    namespace: str
    pod: str
    milli: int

    def __str__(self) -> str:
        share = "" if self.milli >= MILLI_PER_GPU else f" ({self.milli}m)"
        return f"{self.namespace}/{self.pod}{share}"


@dataclass
class DeviceView:
    index: int
    uuid: str = ""
    product: str = ""
    memory_mib: int = 0
    healthy: bool = True
    utilization: int | None = None  # percent, as the node agent last reported it
    reason: str = ""
    holders: list[Holder] = field(default_factory=list)

    @property
    def milli_used(self) -> int:
        return min(MILLI_PER_GPU, sum(h.milli for h in self.holders))

    def as_dict(self) -> dict[str, Any]:
        return {
            "index": self.index,
            "uuid": self.uuid,
            "product": self.product,
            "memoryMiB": self.memory_mib,
            "healthy": self.healthy,
            "utilization": self.utilization,
            "reason": self.reason,
            "milliUsed": self.milli_used,
            "holders": [{"namespace": h.namespace, "pod": h.pod, "milli": h.milli} for h in self.holders],
        }


@dataclass
class NodeView:
    name: str
    leaf: str = ""
    spine: str = ""
    placeable: bool = True
    agent_status: str = ""  # the node agent's agentaflow.gpu/status; "" when no agent reported
    agent_last_update: str = ""  # RFC 3339, as the agent wrote it
    agent_reported: bool = False  # a node agent published this node's devices at least once
    source: str = "Node"  # Node | GPUNode
    devices: list[DeviceView] = field(default_factory=list)

    @property
    def gpus(self) -> int:
        return len(self.devices)

    @property
    def healthy_gpus(self) -> int:
        return sum(d.healthy for d in self.devices)

    @property
    def milli_total(self) -> int:
        return MILLI_PER_GPU * self.healthy_gpus if self.placeable else 0

    @property
    def milli_free(self) -> int:
        if not self.placeable:
            return 0
        return sum(MILLI_PER_GPU - d.milli_used for d in self.devices if d.healthy)

    @property
    def whole_free(self) -> int:
        return sum(1 for d in self.devices if d.healthy and d.milli_used == 0) if self.placeable else 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "leaf": self.leaf,
            "spine": self.spine,
            "placeable": self.placeable,
            "source": self.source,
            "agentReported": self.agent_reported,
            "agentStatus": self.agent_status,
            "agentLastUpdate": self.agent_last_update,
            "gpus": self.gpus,
            "healthyGpus": self.healthy_gpus,
            "allocatedGpus": round((self.milli_total - self.milli_free) / MILLI_PER_GPU, 3),
            "freeWholeGpus": self.whole_free,
            "devices": [d.as_dict() for d in self.devices],
        }


@dataclass(frozen=True)
class Totals:
    """One leaf's (or the cluster's) figures over placeable nodes' healthy devices, as the ledger counts."""

    nodes: int
    gpus: int
    milli_total: int
    milli_free: int
    whole_free: int

    @property
    def utilization(self) -> float:
        return 1.0 - self.milli_free / self.milli_total if self.milli_total else 0.0

    @property
    def fragmentation(self) -> float:
        """Share of free capacity no whole-GPU request can use (free milli outside whole-free GPUs)."""
        if not self.milli_free:
            return 0.0
        return max(0.0, 1.0 - self.whole_free * MILLI_PER_GPU / self.milli_free)

    def as_dict(self) -> dict[str, Any]:
        return {
            "nodes": self.nodes,
            "gpus": self.gpus,
            "allocatedGpus": round((self.milli_total - self.milli_free) / MILLI_PER_GPU, 3),
            "freeGpus": round(self.milli_free / MILLI_PER_GPU, 3),
            "freeWholeGpus": self.whole_free,
            "utilization": round(self.utilization, 4),
            "fragmentation": round(self.fragmentation, 4),
        }


def totals(nodes: list[NodeView]) -> Totals:
    placeable = [n for n in nodes if n.placeable]
    return Totals(
        len(placeable),
        sum(n.healthy_gpus for n in placeable),
        sum(n.milli_total for n in placeable),
        sum(n.milli_free for n in placeable),
        sum(n.whole_free for n in placeable),
    )


def leaf_totals(nodes: list[NodeView]) -> list[tuple[str, str, Totals]]:
    """(spine, leaf, totals) per leaf, sorted; nodes without a leaf label form the leaf ""."""
    by_leaf: dict[tuple[str, str], list[NodeView]] = {}
    for n in nodes:
        by_leaf.setdefault((n.spine, n.leaf), []).append(n)
    return [(spine, leaf, totals(members)) for (spine, leaf), members in sorted(by_leaf.items())]


# ---------------------------------------------------------------------------------------- from Node objects
def _gpu_count(node: dict) -> int:
    status = node.get("status") or {}
    for key in ("allocatable", "capacity"):
        value = (status.get(key) or {}).get(GPU_RESOURCE)
        if value is not None:
            try:
                return int(str(value))
            except ValueError:
                return 0
    return 0


def _agent_devices(annotations: dict) -> list[dict]:
    try:
        entries = json.loads(annotations.get(DEVICES_ANNOTATION) or "[]")
    except ValueError:
        return []
    return [e for e in entries if isinstance(e, dict)] if isinstance(entries, list) else []


def node_placeable(node: dict) -> bool:
    """Ready, not cordoned, and not marked unschedulable by the node agent (as the ledger decides)."""
    meta, spec, status = node.get("metadata") or {}, node.get("spec") or {}, node.get("status") or {}
    if spec.get("unschedulable"):
        return False
    if (meta.get("labels") or {}).get(SCHEDULABLE_LABEL) == "false":
        return False
    ready = [c for c in status.get("conditions") or () if c.get("type") == "Ready"]
    return not ready or ready[0].get("status") == "True"


def _device_from_entry(entry: dict, index: int) -> DeviceView:
    util = entry.get("utilization")
    return DeviceView(
        index=index,
        uuid=str(entry.get("uuid") or ""),
        product=str(entry.get("product") or ""),
        memory_mib=int(entry.get("memoryMiB") or 0),
        healthy=entry.get("healthy", True) is not False,
        utilization=None if util is None else int(util),
        reason=str(entry.get("reason") or ""),
    )


def views_from_nodes(
    nodes: list[dict], pods: list[dict], leaf_label: str = LEAF_LABEL, spine_label: str = SPINE_LABEL
) -> list[NodeView]:
    """One NodeView per GPU node; devices from the agent's annotation, holders from pods' placements."""
    views: dict[str, NodeView] = {}
    for node in nodes:
        meta = node.get("metadata") or {}
        labels, annotations = meta.get("labels") or {}, meta.get("annotations") or {}
        entries = {int(e.get("index", i)): e for i, e in enumerate(_agent_devices(annotations))}
        count = max(_gpu_count(node), max(entries, default=-1) + 1)
        if count == 0:
            continue
        devices = [_device_from_entry(entries.get(i, {}), i) for i in range(count)]
        views[meta["name"]] = NodeView(
            name=meta["name"],
            leaf=labels.get(leaf_label, ""),
            spine=labels.get(spine_label, ""),
            placeable=node_placeable(node),
            agent_status=annotations.get(NODE_STATUS_ANNOTATION, ""),
            agent_last_update=annotations.get(LAST_UPDATE_ANNOTATION, ""),
            devices=devices,
            agent_reported=DEVICES_ANNOTATION in annotations or LAST_UPDATE_ANNOTATION in annotations,
        )
    attach_holders(views, pods)
    return sorted(views.values(), key=lambda v: v.name)


def attach_holders(views: dict[str, NodeView], pods: list[dict]) -> None:
    """Every live gpuledger-placed pod as a holder of the devices its placement names."""
    for pod in pods:
        if (pod.get("status") or {}).get("phase") in TERMINAL_PHASES:
            continue
        placement = placement_of_pod(pod)
        view = views.get(placement.node) if placement else None
        if placement is None or view is None:
            continue
        meta = pod.get("metadata") or {}
        by_index = {d.index: d for d in view.devices}
        for index, milli in placement.holdings():
            if index in by_index:
                by_index[index].holders.append(Holder(meta.get("namespace", ""), meta.get("name", ""), milli))


# -------------------------------------------------------------------------------------- from GPUNode objects
def _holders_of(entry: dict) -> list[Holder]:
    raw = entry.get("holders") or entry.get("pods") or []
    if isinstance(entry.get("pod"), str):
        raw = [{"pod": entry["pod"], "milli": entry.get("milli", MILLI_PER_GPU)}]
    out = []
    for h in raw if isinstance(raw, list) else ():
        if isinstance(h, str):
            h = {"pod": h}
        namespace, _, name = str(h.get("pod") or h.get("name") or "").rpartition("/")
        out.append(Holder(str(h.get("namespace") or namespace), name, int(h.get("milli") or MILLI_PER_GPU)))
    return out


def _gpu_node_device(entry: dict, index: int) -> DeviceView:
    device = _device_from_entry(entry, index)
    if entry.get("health") is not None:  # the controller writes "Healthy" or "Unhealthy"
        device.healthy = entry["health"] == "Healthy"
    device.holders = _holders_of(entry)
    return device


def views_from_gpu_nodes(gpu_nodes: list[dict]) -> list[NodeView]:
    """One NodeView per GPUNode: the controller's status (health, schedulable, agentHeartbeatTime), or the
    earlier writers' status or spec (healthy, placeable, agentLastUpdate)."""
    views = []
    for obj in gpu_nodes:
        body = obj.get("status") or obj.get("spec") or {}
        devices = [
            _gpu_node_device(entry, int(entry.get("index", i)))
            for i, entry in enumerate(body.get("devices") or ())
        ]
        last_update = body.get("agentHeartbeatTime") or body.get("agentLastUpdate") or body.get("lastUpdate")
        views.append(
            NodeView(
                name=str(body.get("nodeName") or obj["metadata"]["name"]),
                leaf=str(body.get("leaf") or ""),
                spine=str(body.get("spine") or ""),
                placeable=body.get("placeable", body.get("schedulable", True)) is not False,
                agent_status=str(body.get("agentStatus") or ""),
                agent_last_update=str(last_update or ""),
                agent_reported=bool(last_update or body.get("agentStatus")),
                source="GPUNode",
                devices=devices,
            )
        )
    return sorted(views, key=lambda v: v.name)
