"""The node agent: publishes what NVML sees on a node as the `agentaflow.gpu/*` labels and annotations.

The ledger reads `agentaflow.gpu/devices` to know device identities and health, so an unhealthy GPU stops
receiving placements as soon as the agent's patch reaches the API server (the sync adapter forwards Node
changes to the ledger), and `agentaflow.gpu/device-holders` to know which pod holds each device (from the
kubelet's PodResources API) and which devices hold memory of processes outside Kubernetes. The patch itself is
a pure function of the probe's reports, the holders, the XID errors and `now`. The one thing NVML cannot be
asked again, a critical XID, is kept on the Node (`agentaflow.gpu/xid-errors`), which a restarted agent reads
back, so the agent keeps no state a restart could lose.
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

from gpuledger.names import (
    AGENT_NETWORK_BANDWIDTH_LABEL,
    DEVICES_ANNOTATION,
    GPU_COUNT_LABEL,
    GPU_ENABLED_LABEL,
    HOLDERS_ANNOTATION,
    LAST_UPDATE_ANNOTATION,
    NODE_STATUS_ANNOTATION,
    SCHEDULABLE_LABEL,
    UTILIZATION_TIER_LABEL,
    XIDS_ANNOTATION,
)
from gpuledger.node_agent.bandwidth import DEFAULT_SYS_ROOT, label_value, node_bandwidth_gbps
from gpuledger.node_agent.holders import DeviceHolders, observe
from gpuledger.node_agent.pod_resources import DEFAULT_RESOURCES, DEFAULT_SOCKET, PodResourcesClient
from gpuledger.node_agent.probes import DeviceReport, FakeProbe, GpuProbe, NvmlProbe, ProbeError, XidEvent
from gpuledger.node_agent.processes import DEFAULT_PROC_ROOT
from gpuledger.node_agent.xids import APPLICATION_XIDS, XidLog, parse_ignored, read_boot_id, utc_stamp

log = logging.getLogger("gpuledger.node_agent")

TIER_BOUNDS = ((30, "low"), (70, "medium"))  # mean utilization % below the bound -> tier; else "high"
# node_patch's default for the bandwidth: not read, so the label is left as it is on the Node
NOT_READ = "not read"
CONFLICT_TRIES = 3  # reads and patches of the Node when another writer changed it in between


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


def node_patch(
    reports: list[DeviceReport],
    now: datetime,
    holders: DeviceHolders | None = None,
    xids: XidLog | None = None,
    bandwidth_gbps: float | str | None = NOT_READ,
) -> dict:
    """A strategic-merge patch for the Node: labels for selection, annotations for the ledger. With `xids`,
    the GPUs it names are reported unhealthy and the log is written (removed when empty). With a bandwidth
    read (gpuledger.node_agent.bandwidth), its label is written, or removed when None (the links went
    down: a stale rate must not keep meeting a bandwidth request)."""
    if xids is not None:
        reports = xids.mark(reports)
    healthy = sum(r.healthy for r in reports)
    patch: dict[str, dict[str, dict[str, str | None]]] = {
        "metadata": {
            "labels": {
                GPU_ENABLED_LABEL: "true" if reports else "false",
                SCHEDULABLE_LABEL: "true" if healthy else "false",
                GPU_COUNT_LABEL: str(len(reports)),
                UTILIZATION_TIER_LABEL: utilization_tier(reports),
            },
            "annotations": {  # a None value removes that annotation (strategic merge)
                DEVICES_ANNOTATION: json.dumps(
                    [r.as_annotation_entry() for r in reports], separators=(",", ":")
                ),
                NODE_STATUS_ANNOTATION: node_status(reports),
                LAST_UPDATE_ANNOTATION: utc_stamp(now),
            },
        }
    }
    if isinstance(bandwidth_gbps, float | int):
        patch["metadata"]["labels"][AGENT_NETWORK_BANDWIDTH_LABEL] = label_value(bandwidth_gbps)
    elif bandwidth_gbps is None:
        patch["metadata"]["labels"][AGENT_NETWORK_BANDWIDTH_LABEL] = None
    if holders is not None:
        patch["metadata"]["annotations"][HOLDERS_ANNOTATION] = holders.annotation()
    if xids is not None:
        patch["metadata"]["annotations"][XIDS_ANNOTATION] = xids.annotation()
    return patch


def capacity_patch(reports: list[DeviceReport], resource: str) -> dict:
    """A Node status patch advertising the healthy GPUs as `resource` capacity, for nodes where no device
    plugin does (`runtime-uuids` with the stock plugin switched off): kube-scheduler and the kubelet then
    still count GPUs, and the kubelet derives allocatable from it."""
    return {"status": {"capacity": {resource: str(sum(r.healthy for r in reports))}}}


class NodeAgent:
    """Probes, patches the Node, sleeps; stops on `stop()` (SIGTERM in the DaemonSet).

    Every `interval_s` it publishes everything; between those it looks at the device holders and the XID
    errors every `holders_interval_s` and patches at once when the holders changed or a GPU reported a
    critical XID, so the ledger learns of a pod's devices, or of a broken GPU, in seconds. The last published
    holders text is kept only to spot a change: a restart publishes in full. XIDs not yet published wait in
    `pending_xids`; each patch merges them into the log on the Node as the agent last saw it (the answer to
    its last patch; read at start, after a conflict or a failure) and is conditional on that resourceVersion,
    so an operator's clearing of the log is never overwritten with an older copy, and no GET precedes each
    patch.
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
        ignored_xids: frozenset[int] = APPLICATION_XIDS,
        boot_id: str | None = None,
        sys_root: Path = DEFAULT_SYS_ROOT,
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
        self.ignored_xids = ignored_xids
        self.boot_id = read_boot_id(self.proc_root) if boot_id is None else boot_id
        self.sys_root = Path(sys_root)  # the host's /sys: the network devices' speeds and rates
        self.published_holders: str | None = None
        self.pending_xids: list[tuple[XidEvent, datetime]] = []
        self.node_seen = None  # the Node as this agent's last patch left it (the API server's answer)
        self._stop = threading.Event()

    def observe(self, now: datetime) -> tuple[list[DeviceReport], DeviceHolders]:
        for event in self.probe.xid_events():
            if event.xid in self.ignored_xids:
                log.info(
                    "XID %d on GPU %d: an application's fault, the GPU stays healthy", event.xid, event.device
                )
            else:
                self.pending_xids.append((event, now))
        reports = self.probe.devices()
        return reports, observe(reports, self.probe, self.pod_resources, self.resources, self.proc_root)

    def publish_once(self, now: datetime | None = None) -> dict:
        now = now or datetime.now(UTC)
        return self._publish(*self.observe(now), now)

    def publish_if_changed(self, now: datetime | None = None) -> dict | None:
        """The patch sent when the holders differ from the last ones published or a GPU reported a critical
        XID, else None (nothing sent)."""
        now = now or datetime.now(UTC)
        reports, holders = self.observe(now)
        if holders.annotation() == self.published_holders and not self.pending_xids:
            return None
        return self._publish(reports, holders, now)

    def _publish(self, reports: list[DeviceReport], holders: DeviceHolders, now: datetime) -> dict:
        node, self.node_seen = self.node_seen, None  # kept again only once this publication succeeds
        for attempt in range(1, CONFLICT_TRIES + 1):
            if node is None:
                node = self.core_api.read_node(self.node_name)
            stored = (node.metadata.annotations or {}).get(XIDS_ANNOTATION)
            xids = XidLog.from_annotation(stored, self.boot_id).record(
                self.pending_xids, reports, self.ignored_xids
            )
            patch = node_patch(reports, now, holders, xids, node_bandwidth_gbps(self.sys_root))
            version = node.metadata.resource_version
            guarded = {**patch, "metadata": {**patch["metadata"], "resourceVersion": version}}
            try:
                node = self.core_api.patch_node(self.node_name, guarded)
                break
            except Exception as exc:  # kubernetes' ApiException; 409: the Node changed since it was seen
                if getattr(exc, "status", None) != 409 or attempt == CONFLICT_TRIES:
                    raise
                node = None
        self.pending_xids = []
        if self.advertise_resource:
            node = self.core_api.patch_node_status(
                self.node_name, capacity_patch(xids.mark(reports), self.advertise_resource)
            )
        self.node_seen = node
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


def print_patch(probe: GpuProbe, pod_resources: PodResourcesClient, resources: list[str], args) -> dict:
    """`--print`: the patch this node would get now (no Node is read: only the XIDs reported meanwhile)."""
    now = datetime.now(UTC)
    reports = probe.devices()
    holders = observe(reports, probe, pod_resources, resources, args.proc_root)
    xids = XidLog(read_boot_id(args.proc_root)).record(
        [(event, now) for event in probe.xid_events()], reports, args.ignore_xids
    )
    return node_patch(reports, now, holders, xids, node_bandwidth_gbps(args.sys_root))


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
        "--sys-root",
        type=Path,
        default=DEFAULT_SYS_ROOT,
        help=f"the host's /sys, whose network devices give {AGENT_NETWORK_BANDWIDTH_LABEL} (InfiniBand "
        "ports' rates, else the fastest Ethernet link; docs/node-agent.md)",
    )
    parser.add_argument(
        "--advertise-capacity",
        metavar="RESOURCE",
        help="also advertise the healthy GPUs as this extended resource's capacity on the Node status "
        "(e.g. nvidia.com/gpu), for nodes where no device plugin does: visibility_mode runtime-uuids with "
        "the stock plugin off (nvidia.com/gpu.deploy.device-plugin=false); never where a device plugin runs",
    )
    parser.add_argument(
        "--ignore-xids",
        default=",".join(map(str, sorted(APPLICATION_XIDS))),
        help="XID errors that leave a GPU healthy: comma-separated numbers, or none (default %(default)s: "
        "the ones an application's own fault raises)",
    )
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        args.ignore_xids = parse_ignored(args.ignore_xids)
        probe = make_probe(args.fake)
    except (ProbeError, ValueError) as exc:
        print(f"gpuledger node-agent: {exc}")
        return 2
    try:
        return run_agent(args, probe)
    finally:
        probe.close()


def run_agent(args: argparse.Namespace, probe: GpuProbe) -> int:
    resources = [r.strip() for r in args.resources.split(",") if r.strip()]
    if not resources:
        print(f"gpuledger node-agent: --resources {args.resources!r} names no resource; e.g. nvidia.com/gpu")
        return 2
    pod_resources = PodResourcesClient(args.pod_resources_socket, args.pod_resources_timeout)
    if args.print:
        print(json.dumps(print_patch(probe, pod_resources, resources, args), indent=2))
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
        ignored_xids=args.ignore_xids,
        sys_root=args.sys_root,
    )
    if args.once:
        agent.publish_once()
        return 0
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    agent.run()
    return 0
