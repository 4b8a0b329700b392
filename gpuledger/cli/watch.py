"""`gpuledger watch`: status, nodes and workloads redrawn every few seconds until Ctrl-C.

A rich Live view on a terminal; elsewhere (a pipe, a log) each frame is printed in turn. `--count N` stops
after N frames, for scripts and tests. Read-only.
"""

from __future__ import annotations

import argparse
import sys
import time
from datetime import UTC, datetime

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.text import Text

from gpuledger.cli import common
from gpuledger.cli.kube import Kube
from gpuledger.cli.nodes import nodes_table
from gpuledger.cli.snapshot import Snapshot
from gpuledger.cli.status import queue_table, totals_table, waiting_table
from gpuledger.cli.workloads import workloads_table


def build_parser() -> argparse.ArgumentParser:
    p = common.parser("watch", "A live view of status, nodes and workloads until Ctrl-C.", output=False)
    p.add_argument("--interval", type=float, default=2.0, metavar="SECONDS", help="redraw every (default 2)")
    p.add_argument("--count", type=int, default=0, metavar="N", help="stop after N frames (default: never)")
    p.add_argument("--devices", action="store_true", help="show every device, not only the per-leaf totals")
    common.add_source(p)
    return p


def frame(kube: Kube, args: argparse.Namespace) -> Group:
    scope = common.namespace_scope(args, kube)
    now = datetime.now(UTC)
    snap = Snapshot.read(kube, scope, now=now, source=args.source)
    heading: list[RenderableType] = [
        f"gpuledger watch  {now:%Y-%m-%d %H:%M:%S}Z  every {args.interval:g}s  (Ctrl-C to stop)",
        *([f"warning: {snap.notice}"] if snap.notice else []),
    ]
    sections = [
        totals_table(snap.nodes),
        queue_table(snap.workloads, now),
        waiting_table(snap.workloads, now),  # the pods waiting for GPUs, in line
        workloads_table(snap.workloads, now, scope is None),
        *([nodes_table(snap.nodes)] if args.devices else []),
    ]
    # a blank line before each section, as `status` prints them
    return Group(*heading, *(r for s in sections for r in (Text(""), s)))


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        kube = common.connect(args)
        frames = 0
        try:
            if sys.stdout.isatty():
                with Live(frame(kube, args), console=Console(), screen=False, auto_refresh=False) as live:
                    frames = 1
                    while not args.count or frames < args.count:
                        time.sleep(args.interval)
                        live.update(frame(kube, args), refresh=True)
                        frames += 1
            else:
                while not args.count or frames < args.count:
                    if frames:
                        time.sleep(args.interval)
                    sys.stdout.write(common.render_text(frame(kube, args)) + "\n")
                    sys.stdout.flush()
                    frames += 1
        except KeyboardInterrupt:
            pass
        return common.EXIT_OK

    return common.run("watch", body)
