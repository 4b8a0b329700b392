"""The node agent: publishes what NVML sees on a node as the `agentaflow.gpu/*` labels and annotations.

The ledger reads `agentaflow.gpu/devices` to know device identities and health, so an unhealthy GPU stops
receiving placements as soon as the agent's patch reaches the API server (the sync adapter forwards Node
changes to the ledger). The patch itself is a pure function of the probe's reports and `now`.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import threading
from datetime import UTC, datetime

from allocator.node_agent.probes import DeviceReport, FakeProbe, GpuProbe, NvmlProbe, ProbeError

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


def node_patch(reports: list[DeviceReport], now: datetime) -> dict:
    """A strategic-merge patch for the Node: labels for selection, annotations for the ledger."""
    healthy = sum(r.healthy for r in reports)
    return {
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


class NodeAgent:
    """Probes, patches the Node, sleeps; stops on `stop()` (SIGTERM in the DaemonSet)."""

    def __init__(self, node_name: str, probe: GpuProbe, core_api, interval_s: float = 30.0):
        self.node_name = node_name
        self.probe = probe
        self.core_api = core_api  # kubernetes.client.CoreV1Api
        self.interval_s = interval_s
        self._stop = threading.Event()

    def publish_once(self, now: datetime | None = None) -> dict:
        patch = node_patch(self.probe.devices(), now or datetime.now(UTC))
        self.core_api.patch_node(self.node_name, patch)
        return patch

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                self.publish_once()
            except Exception:  # keep publishing: a transient API error must not kill the agent
                log.exception("publishing GPU state for node %s failed", self.node_name)
            self._stop.wait(self.interval_s)

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
    return parser


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s %(message)s")
    try:
        probe = make_probe(args.fake)
    except (ProbeError, ValueError) as exc:
        print(f"gpuledger node-agent: {exc}")
        return 2
    if args.print:
        print(json.dumps(node_patch(probe.devices(), datetime.now(UTC)), indent=2))
        return 0
    from kubernetes import client, config

    if args.kubeconfig:
        config.load_kube_config(args.kubeconfig)
    else:
        try:
            config.load_incluster_config()
        except config.ConfigException:
            config.load_kube_config()
    agent = NodeAgent(args.node, probe, client.CoreV1Api(), args.interval)
    if args.once:
        agent.publish_once()
        return 0
    signal.signal(signal.SIGTERM, lambda *_: agent.stop())
    agent.run()
    probe.close()
    return 0
