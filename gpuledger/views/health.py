"""Health findings: unhealthy devices, devices whose report is stale, nodes whose agent went quiet.

Pure: node views and `now` in, findings out (time is an input, so tests never wait for a report to age).
A node counts as quiet when its agent published before and its last report is older than `stale_after`.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from gpuledger.names import LAST_UPDATE_ANNOTATION, SCHEDULABLE_LABEL
from gpuledger.views.inventory import NodeView, parse_time

# the node agent publishes every 30 s (its --interval); three missed reports make it quiet
DEFAULT_STALE_AFTER = timedelta(seconds=90)


@dataclass(frozen=True)
class Finding:
    node: str
    problem: str  # device-unhealthy | device-stale | agent-quiet | not-placeable
    detail: str
    device: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"node": self.node, "device": self.device, "problem": self.problem, "detail": self.detail}


def findings(
    nodes: list[NodeView], now: datetime, stale_after: timedelta = DEFAULT_STALE_AFTER
) -> list[Finding]:
    out: list[Finding] = []
    for node in nodes:
        if not node.placeable:
            out.append(
                Finding(
                    node.name,
                    "not-placeable",
                    "node not Ready, cordoned, or marked unschedulable "
                    f"by its agent ({SCHEDULABLE_LABEL}=false)",
                )
            )
        quiet = False
        if node.agent_reported:
            last = parse_time(node.agent_last_update)
            if last is None:
                quiet = True
                out.append(
                    Finding(node.name, "agent-quiet", f"no {LAST_UPDATE_ANNOTATION} from the node agent")
                )
            elif now - last > stale_after:
                quiet = True
                out.append(
                    Finding(
                        node.name,
                        "agent-quiet",
                        f"last report {node.agent_last_update}, "
                        f"{int((now - last).total_seconds())}s ago "
                        f"(stale after {int(stale_after.total_seconds())}s)",
                    )
                )
        for device in node.devices:
            if not device.healthy:
                out.append(
                    Finding(
                        node.name,
                        "device-unhealthy",
                        device.reason or "reported unhealthy by NVML",
                        device.index,
                    )
                )
            elif quiet:
                out.append(
                    Finding(
                        node.name,
                        "device-stale",
                        f"health and utilization last reported {node.agent_last_update}"
                        if node.agent_last_update
                        else "health and utilization never reported with a time",
                        device.index,
                    )
                )
    return out
