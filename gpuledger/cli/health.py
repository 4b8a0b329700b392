"""`gpuledger health [NODE...]`: unhealthy or stale devices and nodes whose agent went quiet.

Exits 5 when it finds any (0 when none), so a cron job or a probe can act on it. Read-only.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime, timedelta

from rich.console import RenderableType

from gpuledger.cli import common
from gpuledger.cli.snapshot import Snapshot
from gpuledger.views import health


def build_parser() -> argparse.ArgumentParser:
    p = common.parser(
        "health", "Unhealthy or stale devices, and nodes whose agent went quiet.", namespaced=False
    )
    p.add_argument("node", nargs="*", help="only these nodes")
    p.add_argument(
        "--stale-after",
        type=float,
        default=health.DEFAULT_STALE_AFTER.total_seconds(),
        metavar="SECONDS",
        help="a node agent report older than this is stale (default 90)",
    )
    common.add_source(p)
    return p


def report(found: list[health.Finding], checked: dict[str, int]) -> list[RenderableType]:
    """The problems, one per row, then a summary; with none, the summary line alone."""
    if not found:
        return [f"all {checked['gpus']} GPUs on {checked['nodes']} nodes healthy and reporting"]
    return [
        common.table(
            ["node", "gpu", "problem", "detail"],
            [[f.node, "-" if f.device is None else f.device, f.problem, f.detail] for f in found],
        ),
        f"{len(found)} problem(s) on {len({f.node for f in found})} of {checked['nodes']} GPU nodes",
    ]


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        kube = common.connect(args)
        now = datetime.now(UTC)
        snap = Snapshot.read(kube, None, now=now, workloads=False, source=args.source)
        if snap.notice:
            common.warn("health", snap.notice)
        views = snap.nodes
        if args.node:
            views = [v for v in views if v.name in args.node]
        found = health.findings(views, now, timedelta(seconds=args.stale_after))
        checked = {"nodes": len(views), "gpus": sum(v.gpus for v in views)}
        common.emit(
            args, {"checked": checked, "findings": [f.as_dict() for f in found]}, *report(found, checked)
        )
        return common.EXIT_PROBLEMS if found else common.EXIT_OK

    return common.run("health", body)
