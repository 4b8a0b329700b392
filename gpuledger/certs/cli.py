"""`gpuledger certs generate|rotate`: the webhook's TLS material as files and Kubernetes manifests."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timedelta
from pathlib import Path

from gpuledger.certs import bundle, render
from gpuledger.names import SYSTEM_NAMESPACE

REPO_ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OVERLAY = REPO_ROOT / "kustomize" / "overlays" / "dev"


def _parse_now(text: str | None) -> datetime | None:
    if text is None:
        return None
    try:
        return datetime.fromisoformat(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--now {text!r} is not an ISO-8601 time; accepted e.g. 2025-01-31T12:00:00+00:00"
        ) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpuledger certs", description=__doc__)
    sub = parser.add_subparsers(dest="action", required=True)

    gen = sub.add_parser("generate", help="a new CA, serving certificate, Secrets and caBundle patches")
    gen.add_argument("--service", default="gpuledger", help="webhook Service name (default gpuledger)")
    gen.add_argument(
        "--namespace", default=SYSTEM_NAMESPACE, help=f"its namespace (default {SYSTEM_NAMESPACE})"
    )
    gen.add_argument("--out", required=True, type=Path, help="directory to write into")
    gen.add_argument("--dns", action="append", default=[], help="extra DNS SAN (repeatable)")
    gen.add_argument("--ip", action="append", default=[], help="extra IP SAN (repeatable), e.g. 127.0.0.1")
    gen.add_argument("--days", type=int, default=90, help="serving certificate lifetime (default 90)")
    gen.add_argument("--ca-days", type=int, default=365, help="CA lifetime (default 365)")
    gen.add_argument("--secret-name", default=render.TLS_SECRET)
    gen.add_argument(
        "--overlay",
        type=Path,
        default=DEFAULT_OVERLAY if DEFAULT_OVERLAY.exists() else None,
        help="kustomize overlay that DIR/kustomization.yaml builds on (default kustomize/overlays/dev)",
    )
    gen.add_argument("--no-kustomization", action="store_true", help="write no kustomization.yaml")
    gen.add_argument("--no-placement-key", action="store_true", help="write no placement key Secret")
    gen.add_argument("--now", help="ISO-8601 issue time (default: the current time)")

    rot = sub.add_parser("rotate", help="renew the serving certificate (and roll the CA) when due")
    rot.add_argument("--dir", required=True, type=Path, help="directory written by `certs generate`")
    rot.add_argument("--now", help="ISO-8601 time to decide at (default: the current time)")
    rot.add_argument("--force", action="store_true", help="renew the serving certificate even if not due")
    rot.add_argument("--fraction", type=float, default=2 / 3, help="share of a lifetime after which to renew")
    rot.add_argument(
        "--ca-overlap-hours",
        type=float,
        default=bundle.DEFAULT_CA_OVERLAP.total_seconds() / 3600,
        help="how long a new CA sits in the caBundle before it signs (default 24)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        now = _parse_now(args.now)
    except argparse.ArgumentTypeError as exc:
        print(f"gpuledger certs: {exc}", file=sys.stderr)
        return 2
    if args.action == "generate":
        if args.overlay is not None and not args.no_kustomization and not args.overlay.is_dir():
            print(f"gpuledger certs: --overlay {args.overlay} is not a directory", file=sys.stderr)
            return 2
        paths = bundle.generate(
            args.out,
            args.service,
            args.namespace,
            extra_dns=args.dns,
            ip_addresses=args.ip,
            days=args.days,
            ca_days=args.ca_days,
            now=now,
            overlay=None if args.no_kustomization else args.overlay,
            secret_name=args.secret_name,
            placement_key=not args.no_placement_key,
        )
        for _name, path in sorted(paths.items()):
            print(f"wrote {path}")
        if "kustomization.yaml" in paths:
            print(f"install: kubectl apply -k {args.out}")
        return 0
    try:
        result = bundle.rotate(
            args.dir,
            now=now,
            force=args.force,
            fraction=args.fraction,
            ca_overlap=timedelta(hours=args.ca_overlap_hours),
        )
    except FileNotFoundError as exc:
        print(f"gpuledger certs: {exc}", file=sys.stderr)
        return 2
    done = [
        label
        for flag, label in (
            (result.ca_next_created, "next CA published in the bundle"),
            (result.ca_promoted, "next CA now signs"),
            (result.serving_rotated, "serving certificate renewed"),
        )
        if flag
    ]
    print("; ".join(done) if done else "nothing due")
    print(f"serving certificate valid until {result.serving_not_after.isoformat()}")
    print(f"CA valid until {result.ca_not_after.isoformat()}")
    for note in result.notes:
        print(f"note: {note}")
    if result.ca_next_created or result.ca_promoted:
        print(f"apply: kubectl apply -k {args.dir}  (the caBundle changed)")
    elif result.changed:
        print(f"apply: kubectl apply -f {args.dir / bundle.SECRET_FILE}  (or kubectl apply -k {args.dir})")
    return 0
