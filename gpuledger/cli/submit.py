"""`gpuledger submit FILE`: create GPUWorkloads, or apply Job/Pod manifests into an opted-in namespace.

Objects go through the API (server-side apply, field manager `gpuledger`), so the webhook places every pod
as it would any other. A pod-making manifest aimed at a namespace not opted in to admission is refused
before anything is sent: its pods would run with no GPU placement.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from gpuledger.cli import common
from gpuledger.cli.kube import GPUWORKLOAD_VERSIONS, Kube, KubeError
from gpuledger.names import ADMISSION_ENABLED, ADMISSION_LABEL, GPUWORKLOAD_PLURAL

FIELD_MANAGER = "gpuledger"
POD_MAKERS = {("v1", "Pod"), ("batch/v1", "Job"), ("apps/v1", "Deployment"), ("apps/v1", "StatefulSet")}


def build_parser() -> argparse.ArgumentParser:
    p = common.parser("submit", "Create GPUWorkloads, or apply Job/Pod manifests into an opted-in namespace.")
    p.add_argument("file", help="a YAML/JSON file with one or more documents ('-' reads stdin)")
    p.add_argument(
        "--dry-run", action="store_true", help="ask the API server to check everything, store nothing"
    )
    return p


def read_documents(path: str) -> list[dict]:
    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8")
        docs = [d for d in yaml.safe_load_all(text) if d]
    except (OSError, yaml.YAMLError) as exc:
        raise common.CommandError(f"{path}: {exc}", common.EXIT_USAGE) from exc
    if not docs:
        raise common.CommandError(f"{path}: no objects in the file", common.EXIT_USAGE)
    for i, doc in enumerate(docs):
        where = f"{path} document {i + 1}"
        if not isinstance(doc, dict) or not doc.get("kind") or not doc.get("apiVersion"):
            raise common.CommandError(
                f"{where}: expected an object with apiVersion and kind", common.EXIT_USAGE
            )
        if not (doc.get("metadata") or {}).get("name"):
            raise common.CommandError(
                f"{where}: metadata.name is required (generateName is not applied)", common.EXIT_USAGE
            )
        key = (doc["apiVersion"], doc["kind"])
        if key not in POD_MAKERS and not (
            doc["kind"] == "GPUWorkload" and doc["apiVersion"] in GPUWORKLOAD_VERSIONS
        ):
            accepted = (
                ", ".join(sorted(f"{k} ({v})" for v, k in POD_MAKERS))
                + ", GPUWorkload ("
                + " or ".join(GPUWORKLOAD_VERSIONS)
                + ")"
            )
            raise common.CommandError(
                f"{where}: kind={doc['kind']!r} apiVersion={doc['apiVersion']!r} is not "
                f"accepted: expected one of {accepted}",
                common.EXIT_USAGE,
            )
    return docs


def check_namespace(kube: Kube, doc: dict, namespace: str) -> None:
    """GPUWorkloads need their CRD; pod-making kinds need the namespace opted in to admission."""
    if doc["kind"] == "GPUWorkload":
        if not kube.serves(doc["apiVersion"], GPUWORKLOAD_PLURAL):
            raise common.CommandError(
                f"GPUWorkload {doc['apiVersion']} is not served by this cluster: install "
                "the gpuledger CRDs (manifests/crds)",
                common.EXIT_NOT_FOUND,
            )
        return
    try:
        opted = kube.namespace_opted_in(namespace)
    except KubeError as exc:
        if exc.status != 403:
            raise
        # an identity that may create Jobs but not read Namespaces: the webhook still decides at admission
        common.warn(
            "submit", f"cannot read namespace {namespace} to check its opt-in ({exc}); submitting anyway"
        )
        return
    if opted is None:
        raise common.CommandError(f"namespace {namespace} does not exist", common.EXIT_NOT_FOUND)
    if not opted:
        raise common.CommandError(
            f"namespace {namespace} is not opted in to gpuledger admission (label "
            f"{ADMISSION_LABEL}={ADMISSION_ENABLED} missing), so its {doc['kind']} {doc['metadata']['name']} "
            f"would get no GPU placement; opt it in with `kubectl label namespace {namespace} "
            f"{ADMISSION_LABEL}={ADMISSION_ENABLED}`, or use -n with an opted-in namespace",
            common.EXIT_REFUSED,
        )


def apply(kube: Kube, doc: dict, namespace: str, dry_run: bool = False) -> tuple[dict, bool]:
    """Server-side apply of one object; (the stored object, whether it existed before)."""
    body = {**doc, "metadata": {**doc["metadata"], "namespace": namespace}}
    existed = kube.read(doc["apiVersion"], doc["kind"], doc["metadata"]["name"], namespace) is not None
    return kube.apply(body, namespace, FIELD_MANAGER, dry_run), existed


def resource_name(doc: dict) -> str:
    """kubectl's `job.batch/NAME`, `gpuworkload.agentaflow.io/NAME`."""
    group = doc["apiVersion"].rpartition("/")[0]
    return f"{doc['kind'].lower()}{'.' + group if group else ''}/{doc['metadata']['name']}"


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)

    def body() -> int:
        docs = read_documents(args.file)
        kube = common.connect(args)
        targets = [
            (doc, (doc.get("metadata") or {}).get("namespace") or args.namespace or kube.namespace)
            for doc in docs
        ]
        if args.namespace:
            for doc, ns in targets:
                if ns != args.namespace:
                    raise common.CommandError(
                        f"{resource_name(doc)} names namespace {ns}, but -n says {args.namespace}",
                        common.EXIT_USAGE,
                    )
        for doc, ns in targets:  # every check before the first write: all or nothing as far as we can tell
            check_namespace(kube, doc, ns)
        stored, lines = [], []
        for doc, ns in targets:
            obj, existed = apply(kube, doc, ns, args.dry_run)
            stored.append(obj)
            verb = "configured" if existed else "created"
            lines.append(f"{resource_name(doc)} {verb}{' (server dry run)' if args.dry_run else ''}")
        common.emit(args, {"items": stored}, "\n".join(lines))
        return common.EXIT_OK

    return common.run("submit", body)
