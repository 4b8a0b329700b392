"""`gpuledger nodes [NODE...]`: every GPU device per node, its health, utilization and who holds it.

From GPUNode objects when the controller publishes them, else (or when they are stale: a line on stderr says
so) from Nodes (the node agent's annotations) and placed pods' placement annotations. Nodes whose GPUs a DRA
driver publishes in ResourceSlices (and none as nvidia.com/gpu) follow under "GPUs published through DRA":
gpuledger knows them and does not place on them. Read-only.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from gpuledger.cli import common
from gpuledger.cli.kube import KubeError
from gpuledger.cli.snapshot import Snapshot
from gpuledger.service.dra_nodes import PublishedGpus, dra_nodes
from gpuledger.views import inventory


def build_parser() -> argparse.ArgumentParser:
    p = common.parser(
        "nodes", "Per node and device: health, utilization and who holds what.", namespaced=False
    )
    p.add_argument("node", nargs="*", help="only these nodes")
    common.add_source(p)
    return p


def device_rows(nodes: list[inventory.NodeView]) -> list[list]:
    rows = []
    for n in nodes:
        for d in n.devices:
            health = "Healthy" if d.healthy else f"Unhealthy{': ' + d.reason if d.reason else ''}"
            rows.append(
                [
                    n.name,
                    n.leaf or "-",
                    d.index,
                    d.product or "-",
                    f"{d.memory_mib}Mi" if d.memory_mib else "-",
                    health,
                    "-" if d.utilization is None else f"{d.utilization}%",
                    ", ".join(map(str, d.holders)) or "-",
                ]
            )
    return rows


def nodes_table(nodes: list[inventory.NodeView]):
    return common.table(
        ["node", "leaf", "gpu", "product", "memory", "health", "util", "held-by"],
        device_rows(nodes),
        empty="GPU DEVICES none",
    )


def _slices(kube) -> list[dict]:
    """The ResourceSlices, or none with a line on stderr when this user may not list them."""
    try:
        return kube.resource_slices()
    except KubeError as exc:
        if exc.status != 403:
            raise
        common.warn("nodes", "may not list resourceslices (resource.k8s.io): nodes with DRA GPUs not shown")
        return []


DRA_TITLE = "GPUs published through DRA"


def dra_table(nodes: list[PublishedGpus]):
    """The nodes whose GPUs only a DRA driver publishes: gpuledger does not place on them (docs/cli.md)."""
    rows = [[n.node, n.gpus, n.describe()] for n in nodes]
    return common.table(["node", "gpus", "published"], rows, title=DRA_TITLE) if rows else None


def dra_dict(gpus: PublishedGpus) -> dict:
    return {
        "name": gpus.node,
        "gpus": gpus.gpus,
        "drivers": list(gpus.drivers),
        "products": dict(gpus.products),
        "incompletePools": list(gpus.incomplete),
    }


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        kube = common.connect(args)
        snap = Snapshot.read(kube, None, now=datetime.now(UTC), workloads=False, source=args.source)
        if snap.notice:
            common.warn("nodes", snap.notice)
        views = snap.nodes
        published = dra_nodes(kube.nodes(), _slices(kube))
        if args.node:
            known = {v.name for v in views} | {g.node for g in published}
            missing = [n for n in args.node if n not in known]
            if missing:
                raise common.CommandError(f"no GPU node named {', '.join(missing)}", common.EXIT_NOT_FOUND)
            views = [v for v in views if v.name in args.node]
            published = [g for g in published if g.node in args.node]
        data = {
            "items": [v.as_dict() for v in views],
            "publishedThroughDRA": [dra_dict(g) for g in published],
        }
        extra = dra_table(published)
        common.emit(args, data, nodes_table(views), *([extra] if extra is not None else []))
        return common.EXIT_OK

    return common.run("nodes", body)
