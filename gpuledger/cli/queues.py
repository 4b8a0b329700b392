"""`gpuledger queues`: each GPU queue's quota per product, use, borrowing, lending, weight, parent,
namespaces, fair share, and the pods waiting for GPUs in its namespaces.

Reads GPUQueues, Namespaces, Nodes and Pods from the API server; the figures are the core's rules applied to
them (gpuledger.views.queues). Read-only.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from rich.console import RenderableType

from gpuledger.cli import common
from gpuledger.cli.kube import Kube
from gpuledger.service.queue_standing import QueueError
from gpuledger.views.queues import QueueRow, QueuesView, gpus_of, queues_view
from gpuledger.views.workloads import age

NAMESPACES_SHOWN = 3  # in the table; -o json lists them all


def build_parser() -> argparse.ArgumentParser:
    p = common.parser(
        "queues",
        "GPU queues: quota per product, used, borrowed, lendable, weight, parent, namespaces, fair share "
        "and the pods waiting in line.",
        namespaced=False,
    )
    p.add_argument("name", nargs="?", help="one queue (default: every queue)")
    return p


def read_queues(kube: Kube, only_declared: bool = False) -> QueuesView | None:
    """Every queue's standing from one read of the cluster (None when `only_declared` and no GPUQueue
    exists); CommandError when the GPUQueues cannot be honoured as a whole."""
    gpu_queues = kube.gpu_queues()
    if only_declared and not gpu_queues:
        return None
    try:
        return queues_view(gpu_queues, kube.namespaces(), kube.nodes(), kube.pods())
    except QueueError as exc:
        raise common.CommandError(f"the GPUQueues cannot be honoured: {exc}", common.EXIT_ERROR) from exc


def share_text(row: QueueRow) -> str:
    return f"{row.standing.share:.3f}"


def _namespaces_text(row: QueueRow) -> str:
    shown = row.namespaces[:NAMESPACES_SHOWN]
    more = len(row.namespaces) - len(shown)
    text = ",".join(shown) + (f",+{more}" if more else "")
    return text or "-"


def queues_table(rows: list[QueueRow]) -> RenderableType:
    out: list[list[Any]] = []
    for r in rows:
        s = r.standing
        name = f"{s.name} (default)" if s.default else s.name
        out.append(
            [
                name,
                s.parent or "-",
                f"{s.weight:g}",
                s.quota_gpus,
                gpus_of(s.used_milli),
                gpus_of(s.borrowed_milli),
                gpus_of(s.lendable_milli),
                share_text(r),
                s.fair_order or "-",
                len(r.waiting),
                _namespaces_text(r),
            ]
        )
    return common.table(
        [
            "name",
            "parent",
            "weight",
            "quota",
            "used",
            "borrowed",
            "lendable",
            "share",
            "fair-order",
            "waiting",
            "namespaces",
        ],
        out,
        empty="GPU QUEUES none",
    )


def quotas_table(rows: list[QueueRow]) -> RenderableType:
    """One row per quota entry (and per product a queue uses without one)."""
    out: list[list[Any]] = []
    for r in rows:
        for b in r.standing.buckets:
            out.append(
                [
                    r.name,
                    b.product,
                    b.quota_gpus,
                    "-" if b.borrowing_limit is None else b.borrowing_limit,
                    "-" if b.lending_limit is None else b.lending_limit,
                    gpus_of(b.used_milli),
                    gpus_of(b.borrowed_milli),
                    gpus_of(b.lendable_milli),
                ]
            )
    return common.table(
        ["queue", "product", "quota", "borrowing-limit", "lending-limit", "used", "borrowed", "lendable"],
        out,
        title="QUOTAS",
    )


def waiting_table(rows: list[QueueRow], now: datetime) -> RenderableType:
    line = [(r.name, w) for r in rows for w in r.waiting]
    line.sort(key=lambda qw: qw[1].queue_position or 0)
    return common.table(
        ["queue", "position", "namespace", "name", "priority", "gpus", "waiting for", "age"],
        [
            [
                queue,
                w.queue_position,
                w.namespace,
                w.name,
                w.priority,
                w.gpus,
                w.reason.removeprefix("waiting for "),
                age(w.created, now),
            ]
            for queue, w in line
        ],
        title=f"PODS WAITING FOR GPUS {len(line)}",
        empty="PODS WAITING FOR GPUS none",
    )


def summary(rows: list[QueueRow]) -> list[dict[str, Any]]:
    """Each queue in a few figures, for `gpuledger status -o json`."""
    return [
        {
            "name": r.name,
            "parent": r.standing.parent,
            "quota": r.standing.quota_gpus,
            "used": gpus_of(r.standing.used_milli),
            "borrowed": gpus_of(r.standing.borrowed_milli),
            "lendable": gpus_of(r.standing.lendable_milli),
            "share": round(r.standing.share, 6),
            "waiting": len(r.waiting),
        }
        for r in rows
    ]


def summary_table(rows: list[QueueRow]) -> RenderableType:
    """The short section `gpuledger status` shows."""
    return common.table(
        ["queue", "quota", "used", "borrowed", "waiting", "share"],
        [
            [
                r.name,
                r.standing.quota_gpus,
                gpus_of(r.standing.used_milli),
                gpus_of(r.standing.borrowed_milli),
                len(r.waiting),
                share_text(r),
            ]
            for r in rows
        ],
        title="GPU QUEUES",
    )


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        kube = common.connect(args)
        view = read_queues(kube)
        assert view is not None
        if args.name is not None:
            view.rows = [r for r in view.rows if r.name == args.name]
            if not view.rows:
                raise common.CommandError(f"GPUQueue {args.name!r} not found", common.EXIT_NOT_FOUND)
        for namespace, message in sorted(view.conflicts.items()):
            common.warn("queues", f"namespace {namespace} counts in the default queue: {message}")
        common.emit(
            args,
            view.as_dict(),
            queues_table(view.rows),
            quotas_table(view.rows),
            waiting_table(view.rows, datetime.now(UTC)),
        )
        return common.EXIT_OK

    return common.run("queues", body)
