"""`gpuledger status`: cluster GPU totals, allocation and fragmentation per leaf, the GPUWorkload queue.

Figures are the ledger's definitions computed from the API's objects (see gpuledger.views.inventory); the
default strategy is the one the webhook's loader gives the ledger: the gpuledger Deployment's
SCHEDULING_STRATEGY, else the gpuledger ConfigMap's, else the built-in default (gpuledger.cli.strategy).
Read-only.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from rich.console import RenderableType

from gpuledger.cli import common
from gpuledger.cli.kube import Kube, KubeError
from gpuledger.cli.queues import read_queues, summary, summary_table
from gpuledger.cli.snapshot import Snapshot
from gpuledger.views import inventory
from gpuledger.views.queues import QueuesView
from gpuledger.views.workloads import WorkloadRow, age, phase_counts, queue, waiting_line


def build_parser() -> argparse.ArgumentParser:
    p = common.parser("status", "Cluster GPU totals, allocation and fragmentation per leaf, and the queue.")
    p.add_argument(
        "--system-namespace",
        default=None,
        help="where gpuledger runs: its default strategy (default $GPULEDGER_NAMESPACE, gpuledger-system)",
    )
    common.add_source(p)
    return p


def status_data(snap: Snapshot, strategy: dict | None, queues: QueuesView | None = None) -> dict[str, Any]:
    q = queue(snap.workloads)
    return {
        "cluster": inventory.totals(snap.nodes).as_dict(),
        "leaves": [
            {"spine": s, "leaf": leaf, **t.as_dict()} for s, leaf, t in inventory.leaf_totals(snap.nodes)
        ],
        "workloads": {
            "gpuWorkloads": phase_counts(snap.workloads),
            "placedPods": sum(1 for r in snap.workloads if r.kind == "Pod"),
        },
        "queue": [r.as_dict() for r in q],
        # pods waiting for GPUs in the ledger's line (admitted gated), first in line first
        "waiting": [r.as_dict() for r in waiting_line(snap.workloads)],
        "strategy": strategy,
        # each GPU queue's quota, use, borrowing and waiting pods ([] when no GPUQueue exists)
        "queues": summary(queues.rows) if queues else [],
    }


def totals_table(nodes: list[inventory.NodeView]) -> RenderableType:
    rows = []
    for spine, leaf, t in inventory.leaf_totals(nodes):
        rows.append(_totals_row(spine or "-", leaf or "-", t))
    rows.append(_totals_row("", "TOTAL", inventory.totals(nodes)))
    return common.table(
        ["spine", "leaf", "nodes", "gpus", "allocated", "free", "free-whole", "utilization", "fragmentation"],
        rows,
    )


def _totals_row(spine: str, leaf: str, t: inventory.Totals) -> list[Any]:
    d = t.as_dict()
    return [
        spine,
        leaf,
        d["nodes"],
        d["gpus"],
        common.gpus(d["allocatedGpus"]),
        common.gpus(d["freeGpus"]),
        d["freeWholeGpus"],
        common.percent(t.utilization),
        common.percent(t.fragmentation),
    ]


def queue_table(rows: list[WorkloadRow], now: datetime) -> RenderableType:
    q = queue(rows)
    counts = phase_counts(rows)
    # the title counts every GPUWorkload by phase, the rows are the Queued ones: with none queued, the
    # section is the title's line alone
    title = (
        "GPUWORKLOADS " + "  ".join(f"{phase}={n}" for phase, n in counts.items() if n)
        if any(counts.values())
        else "GPUWORKLOADS none"
    )
    return common.table(
        ["position", "namespace", "name", "priority", "gpus", "reason", "age"],
        [
            [
                r.queue_position if r.queue_position is not None else "-",
                r.namespace,
                r.name,
                r.priority,
                r.gpus,
                r.reason,
                age(r.created, now),
            ]
            for r in q
        ],
        title=title,
        empty=title,
    )


def waiting_table(rows: list[WorkloadRow], now: datetime) -> RenderableType:
    """The pods waiting for GPUs in the ledger's line, with their place in it."""
    line = waiting_line(rows)
    return common.table(
        ["position", "namespace", "name", "priority", "gpus", "waiting for", "age"],
        [
            [r.queue_position, r.namespace, r.name, r.priority, r.gpus, r.reason, age(r.created, now)]
            for r in line
        ],
        title=f"PODS WAITING FOR GPUS {len(line)}",
        empty="PODS WAITING FOR GPUS none",
    )


def read_queue_view(kube: Kube) -> QueuesView | None:
    """The GPU queues' standing, or None when no GPUQueue exists or this identity may not read them."""
    try:
        return read_queues(kube, only_declared=True)
    except (KubeError, common.CommandError) as exc:
        common.warn("status", f"GPU queues not shown: {exc}")
        return None


def read_strategy(kube: Kube, system_namespace: str | None) -> tuple[dict | None, str]:
    """(the default strategy the ledger uses and its source, the line saying so); None and "unknown" with
    the reason when this identity may not read the ConfigMap or Deployment that set it."""
    from gpuledger.cli import strategy as config

    try:
        strategy = config.live_default(kube, system_namespace)
    except (KubeError, common.CommandError) as exc:
        where = config.system_namespace(system_namespace)
        return None, f"default strategy: unknown (the gpuledger config in {where} is not readable: {exc})"
    return strategy, f"default strategy: {strategy['effective']} ({strategy['source']})"


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        kube = common.connect(args)
        scope = args.namespace if args.namespace and not args.all_namespaces else None
        now = datetime.now(UTC)
        snap = Snapshot.read(kube, scope, now=now, source=args.source)
        if snap.notice:
            common.warn("status", snap.notice)
        strategy, line = read_strategy(kube, args.system_namespace)
        queues = read_queue_view(kube)
        common.emit(
            args,
            status_data(snap, strategy, queues),
            totals_table(snap.nodes),
            queue_table(snap.workloads, now),
            waiting_table(snap.workloads, now),
            *([summary_table(queues.rows)] if queues else []),
            line,
        )
        return common.EXIT_OK

    return common.run("status", body)
