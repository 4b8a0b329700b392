"""The node agent: publishes what NVML sees on a node as the `agentaflow.gpu/*` labels and annotations.

The ledger reads `agentaflow.gpu/devices` to know device identities and health, so an unhealthy GPU stops
receiving placements as soon as the agent's patch reaches the API server (the sync adapter forwards Node
changes to the ledger), and `agentaflow.gpu/device-holders` to know which pod holds each device (from the
kubelet's PodResources API) and which devices hold memory of processes outside Kubernetes. The patch itself is
a pure function of the probe's reports, the holders and `now`; the agent keeps no state a restart could lose.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
import time
from collections.abc import Callable, Collection
from datetime import UTC, datetime
from pathlib import Path

from allocator.node_agent.holders import ANNOTATION as HOLDERS_ANNOTATION
from allocator.node_agent.holders import DeviceHolders, observe
from allocator.node_agent.pod_resources import DEFAULT_RESOURCES, DEFAULT_SOCKET, PodResourcesClient
from allocator.node_agent.probes import DeviceReport, FakeProbe, GpuProbe, NvmlProbe, ProbeError
from allocator.node_agent.processes import DEFAULT_PROC_ROOT

log = logging.getLogger("gpuledger.node_agent")

PREFIX = "agentaflow.gpu/"
TIER_BOUNDS = ((30, "low"), (70, "medium"))  # mean utilization % below the bound -> tier; else "high"


def utilization_tier(reports: list[DeviceReport]) -> str:
    healthy = [r.utilization_pct for r in reports if r.healthy]
    if not healthy:
        return "none"
    mean = sum(healthy) / len(healthy)
    for bound, tier in TIER_BOUNDS:
        if mean < bound:
            return tier
    return "high"


def node_status(reports: list[DeviceReport]) -> str:
    healthy = sum(r.healthy for r in reports)
    if not reports:
        return "no-gpus"
    if healthy == len(reports):
        return "healthy"
    return "degraded" if healthy else "unhealthy"


def node_patch(reports: list[DeviceReport], now: datetime, holders: DeviceHolders | None = None) -> dict:
    """A strategic-merge patch for the Node: labels for selection, annotations for the ledger."""
    healthy = sum(r.healthy for r in reports)
    patch = {
        "metadata": {
            "labels": {
                PREFIX + "enabled": "true" if reports else "false",
                PREFIX + "schedulable": "true" if healthy else "false",
                PREFIX + "count": str(len(reports)),
                PREFIX + "utilization-tier": utilization_tier(reports),
            },
            "annotations": {
                PREFIX + "devices": json.dumps(
                    [r.as_annotation_entry() for r in reports], separators=(",", ":")
                ),
                PREFIX + "status": node_status(reports),
                PREFIX + "last-update": now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
        }
    }
    if holders is not None:
        patch["metadata"]["annotations"][HOLDERS_ANNOTATION] = holders.annotation()
    return patch


def capacity_patch(reports: list[DeviceReport], resource: str) -> dict:
    """A Node status patch advertising the healthy GPUs as `resource` capacity, for nodes where no device
    plugin does (`runtime-uuids` with the stock plugin switched off): kube-scheduler and the kubelet then
    still count GPUs, and the kubelet derives allocatable from it."""
    return {"status": {"capacity": {resource: str(sum(r.healthy for r in reports))}}}


class NodeAgent:
    """Probes, patches the Node, sleeps; stops on `stop()` (SIGTERM in the DaemonSet).

    Every `interval_s` it publishes everything; between those it looks at the device holders every
    `holders_interval_s` and patches at once when they changed, so the ledger learns of a pod's devices in
    seconds. The last published holders text is kept only to spot a change: a restart publishes in full.
    """

    def __init__(
        self,
        node_name: str,
        probe: GpuProbe,
        core_api,
        interval_s: float = 30.0,
        pod_resources: PodResourcesClient | None = None,
        resources: Collection[str] = DEFAULT_RESOURCES,
        proc_root: Path = DEFAULT_PROC_ROOT,
        holders_interval_s: float = 2.0,
        clock: Callable[[], float] = time.monotonic,
        advertise_resource: str | None = None,
    ):
        self.node_name = node_name
        self.probe = probe
        self.core_api = core_api  # kubernetes.client.CoreV1Api
        self.interval_s = interval_s
        self.pod_resources = pod_resources or PodResourcesClient()
        self.resources, self.proc_root = tuple(resources), Path(proc_root)
        self.holders_interval_s = holders_interval_s
        self.clock = clock
        self.advertise_resource = advertise_resource
        self.published_holders: str | None = None
        self._stop = threading.Event()

    def observe(self) -> tuple[list[DeviceReport], DeviceHolders]:
        reports = self.probe.devices()
        return reports, observe(reports, self.probe, self.pod_resources, self.resources, self.proc_root)

    def publish_once(self, now: datetime | None = None) -> dict:
        return self._publish(*self.observe(), now)

    def publish_if_changed(self, now: datetime | None = None) -> dict | None:
        """The patch sent when the holders differ from the last ones published, else None (nothing sent)."""
        reports, holders = self.observe()
        if holders.annotation() == self.published_holders:
            return None
        return self._publish(reports, holders, now)

    def _publish(self, reports: list[DeviceReport], holders: DeviceHolders, now: datetime | None) -> dict:
        patch = node_patch(reports, now or datetime.now(UTC), holders)
        self.core_api.patch_node(self.node_name, patch)
        if self.advertise_resource:
            self.core_api.patch_node_status(self.node_name, capacity_patch(reports, self.advertise_resource))
        self.published_holders = holders.annotation()
        return patch

    def run(self) -> None:
        next_full = self.clock()
        while not self._stop.is_set():
            full = self.clock() >= next_full
            try:
                if full:
                    self.publish_once()
                else:
                    self.publish_if_changed()
            except Exception:  # keep publishing: a transient API error must not kill the agent
                log.exception("publishing GPU state for node %s failed", self.node_name)
            if full:
                next_full = self.clock() + self.interval_s
            wait = next_full - self.clock()
            if self.holders_interval_s > 0:
                wait = min(wait, self.holders_interval_s)
            self._stop.wait(max(0.0, wait))

    def stop(self) -> None:
        self._stop.set()


def make_probe(fake_spec: str | None) -> GpuProbe:
    return FakeProbe.from_spec(fake_spec) if fake_spec else NvmlProbe()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuledger node-agent", description=__doc__)
    parser.add_argument("--node", required=True, help="this node's name (the DaemonSet passes spec.nodeName)")
    parser.add_argument("--interval", type=float, default=30.0, help="seconds between publications")
    parser.add_argument("--once", action="store_true", help="publish once and exit")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster, then ~/.kube/config)")
    parser.add_argument(
        "--fake", metavar="SPEC", help="report fake GPUs instead of NVML, e.g. 8xA100:81920,unhealthy=3"
    )
    parser.add_argument("--print", action="store_true", help="print the patch instead of sending it")
    parser.add_argument(
        "--pod-resources-socket",
        type=Path,
        default=DEFAULT_SOCKET,
        help=f"the kubelet's PodResources socket, for {HOLDERS_ANNOTATION} (default {DEFAULT_SOCKET})",
    )
    parser.add_argument(
        "--pod-resources-timeout", type=float, default=5.0, help="seconds to wait for each PodResources call"
    )
    parser.add_argument(
        "--resources",
        default=",".join(DEFAULT_RESOURCES),
        help="comma-separated resource names whose devices are GPUs (default %(default)s)",
    )
    parser.add_argument(
        "--holders-interval",
        type=float,
        default=2.0,
        help="seconds between looks at the device holders, patching when they changed (0: every --interval)",
    )
    parser.add_argument(
        "--proc-root",
        type=Path,
        default=DEFAULT_PROC_ROOT,
        help="the host's /proc, to tell GPU processes in pods from others (hostPID, or the host's /proc "
        "mounted there)",
    )
    parser.add_argument(
        "--advertise-capacity",
        metavar="RESOURCE",
        help="also advertise the healthy GPUs as this extended resource's capacity on the Node status "
        "(e.g. nvidia.com/gpu), for nodes where no device plugin does: visibility_mode runtime-uuids with "
        "the stock plugin off (nvidia.com/gpu.deploy.device-plugin=false); never where a device plugin runs",
    )
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        probe = make_probe(args.fake)
    except (ProbeError, ValueError) as exc:
        print(f"gpuledger node-agent: {exc}")
        return 2
    resources = [r.strip() for r in args.resources.split(",") if r.strip()]
    if not resources:
        print(f"gpuledger node-agent: --resources {args.resources!r} names no resource; e.g. nvidia.com/gpu")
        return 2
    pod_resources = PodResourcesClient(args.pod_resources_socket, args.pod_resources_timeout)
    if args.print:
        reports = probe.devices()
        holders = observe(reports, probe, pod_resources, resources, args.proc_root)
        print(json.dumps(node_patch(reports, datetime.now(UTC), holders), indent=2))
        return 0
    from kubernetes import client, config

    if args.kubeconfig:
        config.load_kube_config(args.kubeconfig)
    else:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
    agent = NodeAgent(
        args.node,
        probe,
        client.CoreV1Api(),
        args.interval,
        pod_resources=pod_resources,
        resources=resources,
        proc_root=args.proc_root,
        holders_interval_s=args.holders_interval,
        advertise_resource=args.advertise_capacity,
    )
    if args.once:
        agent.publish_once()
        return 0
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    agent.run()
    probe.close()
    return 0
