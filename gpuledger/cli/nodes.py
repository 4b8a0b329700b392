"""`gpuledger nodes [NODE...]`: every GPU device per node, its health, utilization and who holds it.

From GPUNode objects when the controller publishes them, else (or when they are stale: a line on stderr says
so) from Nodes (the node agent's annotations) and placed pods' placement annotations. Read-only.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from gpuledger.cli import common
from gpuledger.cli.snapshot import Snapshot
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


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        kube = common.connect(args)
        snap = Snapshot.read(kube, None, now=datetime.now(UTC), workloads=False, source=args.source)
        if snap.notice:
            common.warn("nodes", snap.notice)
        views = snap.nodes
        if args.node:
            known = {v.name for v in views}
            missing = [n for n in args.node if n not in known]
            if missing:
                raise common.CommandError(f"no GPU node named {', '.join(missing)}", common.EXIT_NOT_FOUND)
            views = [v for v in views if v.name in args.node]
        common.emit(args, {"items": [v.as_dict() for v in views]}, nodes_table(views))
        return common.EXIT_OK

    return common.run("nodes", body)
