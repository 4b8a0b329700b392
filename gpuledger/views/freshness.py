"""Whether the controller's GPUNode objects still say what the API server holds, and what to show when not.

The controller writes a GPUNode only when what it says changes, at most once per its --gpunode-interval; so
in a quiet cluster every GPUNode is old and still right. A GPUNode view older than that interval which
disagrees with the Nodes and Pods the API server holds now (a holder gone or new, a device's health, a node
gone) means the controller stopped publishing: the views then come from those Nodes and Pods, with a line
that says so. Pure: objects and `now` in (tests never wait for a view to age).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from gpuledger.views.inventory import DeviceView, NodeView, parse_time, views_from_gpu_nodes, views_from_nodes


@dataclass(frozen=True)
class Choice:
    nodes: list[NodeView]
    notice: str = ""  # why the GPUNode objects were set aside; "" when they were shown


def written_at(gpu_node: dict) -> datetime | None:
    """When this GPUNode's view was written: the controller's status.updatedTime, else the API server's own
    time of the object's last write (managedFields), else its creation."""
    status = gpu_node.get("status") or {}
    meta = gpu_node.get("metadata") or {}
    if status.get("updatedTime"):
        return parse_time(str(status["updatedTime"]))
    writes = [parse_time(str(f.get("time") or "")) for f in meta.get("managedFields") or ()]
    known = [t for t in writes if t is not None]
    return max(known) if known else parse_time(str(meta.get("creationTimestamp") or ""))


def _named_holders(device: DeviceView | None) -> set[tuple[str, str, int]]:
    """Holders that name a pod (a reservation whose pod is not stored yet names none: not compared)."""
    return {(h.namespace, h.pod, h.milli) for h in device.holders if h.pod} if device else set()


def disagreements(published: list[NodeView], live: list[NodeView]) -> list[str]:
    """Nodes on which the GPUNode views and the views from Nodes and Pods differ: a published node gone, a
    device's named holders or health, a pod holding devices on a node no GPUNode names."""
    live_by_name = {v.name: v for v in live}
    published_names = {v.name for v in published}
    out = []
    for view in published:
        now = live_by_name.get(view.name)
        if now is None:
            out.append(view.name)
            continue
        was, is_ = {d.index: d for d in view.devices}, {d.index: d for d in now.devices}
        for index in was.keys() | is_.keys():
            before, after = was.get(index), is_.get(index)
            if _named_holders(before) != _named_holders(after) or (
                before and after and before.healthy != after.healthy
            ):
                out.append(view.name)
                break
    out += [v.name for v in live if v.name not in published_names and any(d.holders for d in v.devices)]
    return sorted(out)


def stale_line(age_s: float | None, interval_s: float, differing: int) -> str:
    age = "of unknown age" if age_s is None else f"{int(age_s)} s old"
    return (
        f"GPUNode objects are {age} (the controller publishes every {interval_s:g} s while anything "
        f"changes) and disagree with the API server on {differing} node(s): showing what the API server "
        "holds now"
    )


def choose(
    gpu_nodes: list[dict], nodes: list[dict], pods: list[dict], now: datetime, interval_s: float
) -> Choice:
    """The GPUNode views while the newest was written within `interval_s` or they still agree with the
    Nodes and Pods; else the views from those Nodes and Pods, and the line saying why."""
    published = views_from_gpu_nodes(gpu_nodes)
    times = [t for t in map(written_at, gpu_nodes) if t is not None]
    age_s = (now - max(times)).total_seconds() if times else None
    if age_s is not None and age_s <= interval_s:
        return Choice(published)
    live = views_from_nodes(nodes, pods)
    differing = disagreements(published, live)
    if not differing:
        return Choice(published)
    return Choice(live, stale_line(age_s, interval_s, len(differing)))
