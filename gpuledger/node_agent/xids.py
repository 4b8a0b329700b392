"""Critical XID errors: a GPU the driver reported broken stays out of placement until someone resets it.

The driver tells of an XID once, as an NVML event; nothing can ask for it later. So the agent keeps the record
where it keeps everything else, on its Node (annotation `agentaflow.gpu/xid-errors`): a restarted agent reads
it back and publishes the same health, and an operator clears it there once the GPU is reset
(`kubectl annotate node NODE agentaflow.gpu/xid-errors-`). A record holds for one boot of the node: a reboot
resets every GPU, so the records of another boot id are dropped.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from types import MappingProxyType

from gpuledger.names import XIDS_ANNOTATION
from gpuledger.node_agent.probes import DeviceReport, XidEvent

log = logging.getLogger("gpuledger.node_agent")

# The XIDs an application's own fault raises (an illegal address, a trap, a preemption after one): the GPU is
# still healthy. The same list NVIDIA's device plugin skips.
APPLICATION_XIDS = frozenset({13, 31, 43, 45, 68, 109})
KEPT_PER_DEVICE = 8  # the newest; the annotation stays small whatever a failing GPU keeps reporting
VERSION = 1


def utc_stamp(when: datetime) -> str:
    """UTC to the second, as the agent's annotations hold times."""
    return when.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class XidError:
    xid: int
    at: str  # UTC, to the second, as the annotation holds it


def read_boot_id(proc_root: Path) -> str:
    """This boot of the node's kernel (the same inside a container): records of another boot are void."""
    try:
        return (proc_root / "sys" / "kernel" / "random" / "boot_id").read_text().strip()
    except OSError as exc:
        log.warning("no boot id under %s (%s): a reboot will not void XID records", proc_root, exc)
        return ""


def parse_ignored(text: str) -> frozenset[int]:
    """`--ignore-xids`: comma-separated XID numbers, or `none`."""
    if text.strip().lower() in ("", "none"):
        return frozenset()
    parts = [part.strip() for part in text.split(",") if part.strip()]
    if not all(part.isdigit() for part in parts):
        raise ValueError(
            f"--ignore-xids {text!r} is not a list of XID numbers: give comma-separated non-negative "
            f"integers (default {','.join(map(str, sorted(APPLICATION_XIDS)))}) or none"
        )
    return frozenset(int(part) for part in parts)


@dataclass(frozen=True)
class XidLog:
    """The critical XIDs of this boot, by GPU UUID, oldest first."""

    boot_id: str
    devices: Mapping[str, tuple[XidError, ...]] = field(default_factory=lambda: MappingProxyType({}))

    @classmethod
    def from_annotation(cls, text: str | None, boot_id: str) -> XidLog:
        """The log the Node holds; empty when it holds none, another boot's, or text that is not the format
        (logged: the agent then writes a valid one)."""
        if not text:
            return cls(boot_id)
        try:
            obj = json.loads(text)
            if obj.get("bootId") != boot_id:
                return cls(boot_id)
            devices = {
                str(uuid): tuple(XidError(int(e["xid"]), str(e["at"])) for e in errors)
                for uuid, errors in obj["devices"].items()
            }
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            log.warning(
                "annotation %s is not {bootId, devices: {UUID: [{xid, at}]}} (%s)", XIDS_ANNOTATION, exc
            )
            return cls(boot_id)
        return cls(boot_id, MappingProxyType({uuid: errors for uuid, errors in devices.items() if errors}))

    def record(
        self,
        events: Iterable[tuple[XidEvent, datetime]],
        reports: list[DeviceReport],
        ignored: frozenset[int],
    ) -> XidLog:
        """This log with the critical ones of `events` (each with when the agent learnt of it) added."""
        uuids = {r.index: r.uuid for r in reports}
        devices = dict(self.devices)
        for event, when in events:
            if event.xid in ignored:  # an application's fault: the GPU stays healthy
                continue
            uuid = uuids.get(event.device)
            if uuid is None:
                log.warning("XID %d on GPU %d, which the probe does not list", event.xid, event.device)
                continue
            log.warning(
                "critical XID %d on GPU %d (%s): no placements there until its reset",
                event.xid,
                event.device,
                uuid,
            )
            devices[uuid] = (*devices.get(uuid, ()), XidError(event.xid, utc_stamp(when)))[-KEPT_PER_DEVICE:]
        return replace(self, devices=MappingProxyType(devices))

    def annotation(self) -> str | None:
        """Compact JSON with sorted keys (an unchanged log gives the same text); None when empty, which a
        strategic-merge patch reads as "remove the annotation"."""
        if not self.devices:
            return None
        devices = {uuid: [{"at": e.at, "xid": e.xid} for e in log] for uuid, log in self.devices.items()}
        document = {"bootId": self.boot_id, "devices": devices, "v": VERSION}
        return json.dumps(document, sort_keys=True, separators=(",", ":"))

    def mark(self, reports: list[DeviceReport]) -> list[DeviceReport]:
        """`reports` with every GPU that has a critical XID unhealthy, its reason naming the XIDs and the way
        back."""
        marked = []
        for report in reports:
            errors = self.devices.get(report.uuid)
            if errors:
                xids = ", ".join(str(e.xid) for e in errors)
                reason = (
                    f"critical XID {xids} (the last at {errors[-1].at}): reset the GPU, then remove the "
                    f"Node's annotation {XIDS_ANNOTATION}"
                )
                if not report.healthy:
                    reason = f"{report.reason}; {reason}"
                report = replace(report, healthy=False, reason=reason)
            marked.append(report)
        return marked
