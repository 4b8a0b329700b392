"""GPUNode statuses from the ledger's snapshot and the Node objects (the node agent's annotations). Pure.

The ledger says who holds each device and what is free; the Node says product, UUID, health, utilization,
leaf and spine. This module only merges the two into one status per node; the controller writes them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gpuledger.controller.mapping import format_time
from gpuledger.names import (
    DEVICES_ANNOTATION,
    LAST_UPDATE_ANNOTATION,
    LEAF_LABEL,
    SCHEDULABLE_LABEL,
    SPINE_LABEL,
)

MILLI = 1000


def _agent_devices(node: Mapping[str, Any]) -> dict[int, dict]:
    text = ((node.get("metadata") or {}).get("annotations") or {}).get(DEVICES_ANNOTATION)
    try:
        entries = json.loads(text) if text else []
    except ValueError:
        return {}
    out = {}
    for e in entries if isinstance(entries, list) else []:
        if isinstance(e, dict) and isinstance(e.get("index"), int):
            out[e["index"]] = e
    return out


def _holder(
    hid: str, pods_by_reservation: Mapping[str, str], confirmed: Mapping[str, bool], milli: int, memory: int
) -> dict[str, Any]:
    pod = pods_by_reservation.get(hid) or (hid[4:] if hid.startswith("pod:") else "")
    out: dict[str, Any] = {"reservationId": hid, "milli": milli}
    if pod:
        out["pod"] = pod
    if memory:
        out["memoryMiB"] = memory
    if hid in confirmed:
        out["confirmed"] = confirmed[hid]
    return out


def node_status(
    name: str,
    ledger_node: Mapping[str, Any],
    node: Mapping[str, Any] | None,
    pods_by_reservation: Mapping[str, str],
    confirmed: Mapping[str, bool],
    now: float,
    leaf_label: str = LEAF_LABEL,
    spine_label: str = SPINE_LABEL,
) -> dict[str, Any]:
    labels = ((node or {}).get("metadata") or {}).get("labels") or {}
    annotations = ((node or {}).get("metadata") or {}).get("annotations") or {}
    agent = _agent_devices(node or {})
    devices, whole_free, free_milli, allocated, shared = [], 0, 0, 0, 0
    for index, dev_free_milli, dev_free_mem, owner, shares in ledger_node.get("devices") or []:
        a = agent.get(index, {})
        holders = []
        if owner is not None:
            holders.append(_holder(owner, pods_by_reservation, confirmed, MILLI, 0))
            allocated += 1
        for hid, milli, memory in shares or []:
            holders.append(_holder(hid, pods_by_reservation, confirmed, milli, memory))
        if owner is None and shares:
            shared += 1
        healthy = a.get("healthy", True)
        entry: dict[str, Any] = {
            "index": index,
            "health": "Healthy" if healthy in (True, "true") else "Unhealthy",
            "allocatedMilli": MILLI - dev_free_milli,
            "holders": holders,
        }
        for key, out_key in (("uuid", "uuid"), ("product", "product")):
            if a.get(key):
                entry[out_key] = str(a[key])
        if isinstance(a.get("memoryMiB"), int):
            entry["memoryMiB"] = a["memoryMiB"]
            entry["allocatedMemoryMiB"] = max(0, a["memoryMiB"] - int(dev_free_mem))
        if isinstance(a.get("utilization"), (int, float)):
            entry["utilization"] = float(a["utilization"])
        devices.append(entry)
        if owner is None and healthy in (True, "true"):
            free_milli += dev_free_milli
            whole_free += dev_free_milli == MILLI
    total = len(devices)
    status: dict[str, Any] = {
        "devices": devices,
        "allocation": {
            "totalGPUs": total,
            "allocatedGPUs": allocated,
            "sharedGPUs": shared,
            "freeGPUs": whole_free,
            "allocatedMilli": sum(d["allocatedMilli"] for d in devices),
            "percent": round(100.0 * sum(d["allocatedMilli"] for d in devices) / (total * MILLI), 2)
            if total
            else 0.0,
        },
        # the ledger's measure (allocator stats): free GPU capacity not in whole free GPUs, as a share of it
        "fragmentation": round(max(0.0, 1.0 - whole_free * MILLI / free_milli), 4) if free_milli else 0.0,
        "schedulable": labels.get(SCHEDULABLE_LABEL, "true") != "false" and node is not None,
        "updatedTime": format_time(now),
    }
    if labels.get(leaf_label):
        status["leaf"] = labels[leaf_label]
    if labels.get(spine_label):
        status["spine"] = labels[spine_label]
    if annotations.get(LAST_UPDATE_ANNOTATION):
        status["agentHeartbeatTime"] = annotations[LAST_UPDATE_ANNOTATION]
    return status


def statuses(
    snapshot: Mapping[str, Any],
    nodes: Mapping[str, Mapping[str, Any]],
    pods_by_reservation: Mapping[str, str],
    now: float,
) -> dict[str, dict[str, Any]]:
    """Node name -> GPUNode status, for every node the ledger knows with at least one GPU."""
    confirmed = {
        rid: state == "confirmed" for rid, (state, _) in (snapshot.get("reservations") or {}).items()
    }
    out = {}
    for name, ledger_node in (snapshot.get("nodes") or {}).items():
        if ledger_node.get("devices"):
            out[name] = node_status(name, ledger_node, nodes.get(name), pods_by_reservation, confirmed, now)
    return out


def same(old: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Equal but for the time written: no write when nothing but the clock moved."""
    if old is None:
        return False
    strip = lambda s: {k: v for k, v in s.items() if k != "updatedTime"}  # noqa: E731
    return strip(old) == strip(new)
