"""What every operator command shares: kubectl's flags, output (tables, -o json|yaml) and the exit codes.

Tables are drawn by rich (aligned columns, kubectl's look: upper-case headers, no borders); JSON and YAML
print the same data the table shows. Never talks to the API itself: commands pass a Kube in.
"""

from __future__ import annotations

import argparse
import io
import json
import sys
from collections.abc import Callable, Sequence
from typing import Any

import yaml
from rich.console import Console, Group, RenderableType
from rich.table import Table
from rich.text import Text

from gpuledger.cli.kube import Kube, KubeError

# exit codes scripts can rely on (docs/cli.md, "Exit codes")
EXIT_OK = 0
EXIT_ERROR = 1  # the API could not be reached or answered an unexpected error
EXIT_USAGE = 2  # bad flags, a bad file or value (argparse uses 2 as well)
EXIT_REFUSED = 3  # the cluster refused: namespace not opted in, admission/schema denial, forbidden, conflict
EXIT_NOT_FOUND = 4  # what the command needs does not exist (namespace, ConfigMap, CRD)
EXIT_PROBLEMS = 5  # `health` found unhealthy or stale devices or quiet agents
OUTPUTS = ("table", "json", "yaml")


class CommandError(Exception):
    """A failure the command explains in one message and maps to an exit code."""

    def __init__(self, message: str, code: int = EXIT_ERROR):
        super().__init__(message)
        self.code = code


def parser(
    prog: str, description: str, *, namespaced: bool = True, output: bool = True
) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"gpuledger {prog}", description=description)
    p.add_argument("--kubeconfig", help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, in-cluster)")
    p.add_argument("--context", help="kubeconfig context (default: the current one)")
    if namespaced:
        p.add_argument("-n", "--namespace", help="namespace (default: the context's, else default)")
        p.add_argument("-A", "--all-namespaces", action="store_true", help="every namespace")
    if output:
        p.add_argument(
            "-o", "--output", choices=OUTPUTS, default="table", help="table (default), json or yaml"
        )
    return p


def add_source(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--source",
        choices=("auto", "gpunodes", "nodes"),
        default="auto",
        help="where devices come from: GPUNode objects, Nodes + placed pods, or auto (GPUNodes when "
        "there are any)",
    )


def connect(args: argparse.Namespace) -> Kube:
    try:
        return Kube.connect(args.kubeconfig, args.context)
    except KubeError as exc:
        raise CommandError(str(exc), EXIT_ERROR) from exc


def namespace_scope(args: argparse.Namespace, kube: Kube) -> str | None:
    """The namespace to list in; None for all namespaces (-A)."""
    if getattr(args, "all_namespaces", False):
        return None
    return getattr(args, "namespace", None) or kube.namespace


def exit_code_for(exc: KubeError) -> int:
    if exc.status == 404:
        return EXIT_NOT_FOUND
    if exc.status in (400, 403, 409, 422):
        return EXIT_REFUSED
    return EXIT_ERROR


def warn(prog: str, message: str) -> None:
    """`gpuledger PROG: warning: message` on stderr, where it never mixes with -o json/yaml output."""
    print(f"gpuledger {prog}: warning: {message}", file=sys.stderr)


def run(prog: str, body: Callable[[], int]) -> int:
    """Run a command body: a CommandError or KubeError becomes `gpuledger PROG: message` and its exit code."""
    try:
        return body()
    except CommandError as exc:
        print(f"gpuledger {prog}: {exc}", file=sys.stderr)
        return exc.code
    except KubeError as exc:
        print(f"gpuledger {prog}: {exc}", file=sys.stderr)
        return exit_code_for(exc)


# ------------------------------------------------------------------------------------------------ output
def table(
    columns: Sequence[str], rows: Sequence[Sequence[Any]], title: str | None = None, empty: str | None = None
) -> RenderableType:
    """A kubectl-looking table: upper-case headers, three spaces between columns, no borders, under its
    title's line (never wrapped to the table's width). Without rows it is one line and no header: `empty`,
    else `TITLE none`."""
    if not rows:
        return Text(empty or f"{title or 'ROWS'} none", style="bold")
    t = Table(
        box=None,
        show_edge=False,
        pad_edge=False,
        header_style="bold",
        padding=(0, 3, 0, 0),
    )
    for c in columns:
        t.add_column(c.upper(), no_wrap=True)
    for row in rows:
        t.add_row(*("" if v is None else str(v) for v in row))
    return Group(Text(title, style="bold"), t) if title else t


def render_text(*renderables: RenderableType, color: bool = False) -> str:
    """The renderables as plain lines (trailing spaces cut), wide enough never to wrap a row."""
    buf = io.StringIO()
    console = Console(
        file=buf,
        width=1000,
        color_system="auto" if color else None,
        force_terminal=color,
        highlight=False,
        soft_wrap=False,
    )
    for i, r in enumerate(renderables):
        if i:
            console.print()
        console.print(r)
    return "\n".join(line.rstrip() for line in buf.getvalue().splitlines()) + "\n"


def emit(args: argparse.Namespace, data: Any, *renderables: RenderableType) -> None:
    """Print `data` as JSON/YAML when -o asks, else the tables."""
    fmt = getattr(args, "output", "table")
    if fmt == "json":
        sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")
    elif fmt == "yaml":
        sys.stdout.write(yaml.safe_dump(data, sort_keys=False))
    else:
        sys.stdout.write(render_text(*renderables, color=sys.stdout.isatty()))


def percent(x: float) -> str:
    return f"{100 * x:.1f}%"


def gpus(x: float) -> str:
    """12 for whole numbers, 11.25 for shares."""
    return str(int(x)) if float(x).is_integer() else f"{x:.2f}"
