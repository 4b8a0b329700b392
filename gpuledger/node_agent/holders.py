"""The `agentaflow.gpu/device-holders` annotation: who holds each device, per the kubelet and the driver.

`observe` reads the truth (PodResources, the probe's process list, /proc); `DeviceHolders.annotation` writes
it as compact JSON with sorted keys, so an unchanged truth gives byte-identical text and the agent can patch
only on change. Nothing is remembered between observations: a restarted agent publishes the same text.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Collection
from dataclasses import dataclass, field
from pathlib import Path

from gpuledger.node_agent.pod_resources import (
    DEFAULT_RESOURCES,
    PodResourcesClient,
    PodResourcesUnavailable,
    map_holders,
)
from gpuledger.node_agent.probes import DeviceReport, GpuProbe
from gpuledger.node_agent.processes import DEFAULT_PROC_ROOT, external_usage

log = logging.getLogger("gpuledger.node_agent")

VERSION = 1


@dataclass(frozen=True)
class DeviceHolders:
    source: str  # "podresources" | "unavailable" (the socket missing or unreadable: holders is then empty)
    holders: dict[str, list[dict]] = field(
        default_factory=dict
    )  # device index -> [{namespace,pod,container}]
    external: dict[str, dict] = field(default_factory=dict)  # device index -> {"memoryMiB", "pids"}
    unmapped: list[str] = field(default_factory=list)  # kubelet device ids no probed device has

    def annotation(self) -> str:
        body = {
            "v": VERSION,
            "source": self.source,
            "holders": self.holders,
            "external": self.external,
            "unmapped": self.unmapped,
        }
        return json.dumps(body, sort_keys=True, separators=(",", ":"))


def observe(
    reports: list[DeviceReport],
    probe: GpuProbe,
    client: PodResourcesClient,
    resources: Collection[str] = DEFAULT_RESOURCES,
    proc_root: Path = DEFAULT_PROC_ROOT,
) -> DeviceHolders:
    """Holders from the kubelet, external memory from the probe's processes; neither failure is fatal."""
    try:
        external = external_usage(probe.processes(), proc_root)
    except Exception as exc:  # noqa: BLE001  # a driver hiccup must not hide who holds the devices
        log.warning("listing GPU processes failed: %s", exc)
        external = {}
    try:
        holdings = client.list()
    except PodResourcesUnavailable as exc:
        log.warning("device holders unknown: %s", exc)
        return DeviceHolders("unavailable", external=external)
    try:
        allocatable = client.allocatable()
    except PodResourcesUnavailable as exc:  # List answered: the holders stand without it
        log.info("GetAllocatableResources failed, unmapped ids come from List only: %s", exc)
        allocatable = {}
    holders, unmapped = map_holders(holdings, reports, resources, allocatable)
    return DeviceHolders("podresources", holders, external, unmapped)
