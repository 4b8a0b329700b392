"""`gpuledger workloads`: GPUWorkloads (both API groups) and gpuledger-placed pods, with phase, node, devices.

Namespace scope as kubectl's: the context's namespace, -n NAME, or -A. Read-only.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from gpuledger.cli import common
from gpuledger.cli.snapshot import Snapshot
from gpuledger.views.workloads import WorkloadRow, age


def build_parser() -> argparse.ArgumentParser:
    p = common.parser("workloads", "GPUWorkloads and gpuledger-placed pods: phase, node and devices.")
    p.add_argument(
        "--pods",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="list placed pods as well as GPUWorkloads (default yes)",
    )
    return p


def workloads_table(rows: list[WorkloadRow], now: datetime, all_namespaces: bool):
    columns = ["namespace"] if all_namespaces else []
    columns += [
        "name",
        "kind",
        "phase",
        "gpus",
        "priority",
        "node",
        "devices",
        "attempts",
        "queue",
        "reason",
        "age",
    ]
    out = []
    for r in rows:
        cells: list[Any] = [r.namespace] if all_namespaces else []
        kind = "GPUWorkload" if r.kind == "GPUWorkload" else (f"Pod ({r.owner})" if r.owner else "Pod")
        cells += [
            r.name,
            kind,
            r.phase,
            r.gpus or "-",
            r.priority or "-",
            ",".join(r.nodes) or "-",
            r.devices or "-",
            "-" if r.attempts is None else r.attempts,
            "-" if r.queue_position is None else r.queue_position,
            r.reason or "-",
            age(r.created, now),
        ]
        out.append(cells)
    return common.table(columns, out, empty="GPUWORKLOADS AND PLACED PODS none")


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        kube = common.connect(args)
        scope = common.namespace_scope(args, kube)
        now = datetime.now(UTC)
        rows = Snapshot.read(kube, scope, now=now, source="nodes").workloads
        if not args.pods:
            rows = [r for r in rows if r.kind == "GPUWorkload"]
        common.emit(
            args,
            {"items": [r.as_dict() for r in rows]},
            workloads_table(rows, now, scope is None),
        )
        return common.EXIT_OK

    return common.run("workloads", body)
