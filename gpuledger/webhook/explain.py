"""`gpuledger explain`: the real mutating path, offline, for a stream of pods against a cluster file.

Pods are admitted in order against one in-process ledger (each placement holds its GPUs for the pods after
it), through the same AdmissionHandler the server runs. Jobs and StatefulSets in the pod file serve as the
pods' owners; one that no pod in the file belongs to is expanded into its pods, as its controller would.
A pod that would wait, in a cluster file with GPUQueues, is shown with the preemption the ledger would plan
for it (each victim and the rule that allows it), or why it would take nothing back.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import json
import sys
import time
from typing import Any

import yaml

from gpuledger.core.pods.objects import iter_objects
from gpuledger.core.pods.waiting_codec import decode_waiting
from gpuledger.names import JOB_COMPLETION_INDEX, POD_INDEX_LABEL, WAITING_ANNOTATION
from gpuledger.service.ledger_service import LedgerService
from gpuledger.service.sources import load_objects
from gpuledger.views.preemption import parse_preemption, preemption_lines
from gpuledger.webhook.admission.handler import AdmissionHandler
from gpuledger.webhook.admission.owners import OWNER_KINDS, StaticOwners
from gpuledger.webhook.admission.review import make_review, parse_review
from gpuledger.webhook.config import WebhookConfig
from gpuledger.webhook.ledger.client import InProcessLedgerClient

EXPLAIN_KEY = "gpuledger-explain"  # signs the printed annotations when no key is configured


def _read_stream(path: str) -> list[dict]:
    if path == "-":
        docs = [d for d in yaml.safe_load_all(sys.stdin) if d is not None]
        return list(iter_objects(docs))  # dicts only
    return load_objects(path)


def _owned_by(pod: dict) -> set[tuple[object, object]]:
    """(kind, name) of each owner reference, as written (a user's file may hold anything there)."""
    refs = (pod.get("metadata") or {}).get("ownerReferences") or []
    return {(r.get("kind"), r.get("name")) for r in refs if isinstance(r, dict)}


def expand_owner(owner: dict) -> list[dict]:
    """The pods a Job (parallelism) or StatefulSet (replicas) controller would create, in index order."""
    meta = owner.get("metadata") or {}
    spec = owner.get("spec") or {}
    template = copy.deepcopy(spec.get("template") or {})
    name, namespace = meta.get("name", "owner"), meta.get("namespace") or "default"
    kind = owner.get("kind")
    if kind == "Job":
        count = int(spec.get("parallelism", 1) or 0)
        if spec.get("completions") is not None:
            count = min(count, int(spec["completions"]))
        indexed = spec.get("completionMode") == "Indexed"
    else:
        count = int(spec.get("replicas", 1) or 0)
        indexed = True
    pods = []
    for i in range(count):
        tmeta = copy.deepcopy(template.get("metadata") or {})
        labels = dict(tmeta.get("labels") or {})
        annotations = dict(tmeta.get("annotations") or {})
        if kind == "Job":
            pod_name = f"{name}-{i}" if indexed else f"{name}-{i:05d}"
            labels.setdefault("job-name", name)
            if indexed:
                annotations[JOB_COMPLETION_INDEX] = str(i)
                labels[JOB_COMPLETION_INDEX] = str(i)
        else:
            pod_name = f"{name}-{i}"
            labels[POD_INDEX_LABEL] = str(i)
            labels["statefulset.kubernetes.io/pod-name"] = pod_name
        pods.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {
                    "name": pod_name,
                    "namespace": namespace,
                    "labels": labels,
                    "annotations": annotations,
                    "ownerReferences": [
                        {
                            "apiVersion": owner.get("apiVersion", ""),
                            "kind": kind,
                            "name": name,
                            "uid": meta.get("uid", ""),
                            "controller": True,
                        }
                    ],
                },
                "spec": copy.deepcopy(template.get("spec") or {}),
            }
        )
    return pods


def pods_in_order(objects: list[dict]) -> list[dict]:
    """Pods as listed; an owner that no listed pod belongs to contributes its pods where it is listed."""
    owned = set().union(*(_owned_by(o) for o in objects if o.get("kind") == "Pod")) if objects else set()
    out = []
    for obj in objects:
        kind = obj.get("kind")
        if kind == "Pod":
            out.append(obj)
        elif kind in OWNER_KINDS and (kind, (obj.get("metadata") or {}).get("name")) not in owned:
            out.extend(expand_owner(obj))
    return out


async def explain_pods(
    cluster: list[dict], objects: list[dict], config: WebhookConfig, now: float | None = None
) -> list[dict[str, Any]]:
    """Admit each pod of `objects` in order; one result dict per pod."""
    now = time.time() if now is None else now
    service = LedgerService(
        config.ledger_config(),
        {"kind": "objects", "objects": cluster},
        now=now,
        settings=config.ledger_settings(),
    )
    handler = AdmissionHandler(
        config, InProcessLedgerClient(service, lambda: now), StaticOwners([*cluster, *objects])
    )
    results = []
    for i, pod in enumerate(pods_in_order(objects)):
        meta = pod.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        review = parse_review(make_review(pod, uid=f"explain-{i}", namespace=namespace))
        decision = await handler.mutate(review)
        preemption = _preemption(service, decision.patch, config, now)
        results.append(
            {
                "pod": f"{namespace}/{meta.get('name') or meta.get('generateName') or '<unnamed>'}",
                "allowed": decision.allowed,
                "node": decision.node,
                "devices": list(decision.devices),
                "reservation_id": decision.reservation_id,
                "patch": decision.patch,
                "reason": decision.message
                or ("needs no GPU: admitted unchanged" if decision.outcome == "no_gpu" else ""),
                "code": decision.code,
                "warnings": decision.warnings,
                "preemption": preemption.as_dict() if preemption is not None else None,
            }
        )
    return results


def _preemption(service: LedgerService, patch: list[dict], config: WebhookConfig, now: float):
    """For a pod admitted to wait (its signed ticket in the patch): the ledger's preemption words, parsed."""
    whole, one = "/metadata/annotations", "/metadata/annotations/" + WAITING_ANNOTATION.replace("/", "~1")
    text = None
    for op in patch:
        value = op.get("value")
        if op.get("path") == one:
            text = value
        elif op.get("path") == whole and isinstance(value, dict):
            text = value.get(WAITING_ANNOTATION, text)
    ticket = decode_waiting(text, config.placement_key()) if text else None
    if ticket is None:
        return None
    return parse_preemption(service.explain(ticket.request, now=now).preemption)


def _text(results: list[dict]) -> str:
    lines = []
    for r in results:
        verdict = "ALLOWED" if r["allowed"] else f"DENIED ({r['code']})"
        where = f" node {r['node']} devices {','.join(map(str, r['devices'])) or '-'}" if r["node"] else ""
        lines.append(f"{r['pod']}: {verdict}{where}")
        lines.append(f"  reason: {r['reason']}")
        for w in r["warnings"]:
            lines.append(f"  warning: {w}")
        if r.get("preemption"):
            view = parse_preemption(r["preemption"]["text"])
            lines += [f"  {line}" for line in preemption_lines(view)] if view is not None else []
        if r["patch"]:
            lines.append("  patch:")
            for op in r["patch"]:
                value = "" if "value" not in op else " " + json.dumps(op["value"], separators=(",", ":"))
                lines.append(f"    {op['op']} {op['path']}{value}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuledger explain", description=__doc__.splitlines()[0])
    parser.add_argument("pods", help="YAML stream of Pods (and their Jobs/StatefulSets); - for stdin")
    parser.add_argument("--cluster", required=True, help="YAML of Node (and Pod) objects: the cluster")
    parser.add_argument("-o", "--output", choices=("text", "json"), default="text")
    parser.add_argument("--config", help="webhook config YAML (binding/visibility mode, strategy, key...)")
    parser.add_argument(
        "--hmac-key-file", help="placement signing key (to read placed pods in the cluster file)"
    )
    parser.add_argument(
        "--now", type=float, help="the ledger's clock (seconds since the epoch); default: now"
    )
    args = parser.parse_args(argv)
    try:
        config = WebhookConfig.from_file(args.config) if args.config else WebhookConfig()
        if args.hmac_key_file:
            config.hmac_key_file = args.hmac_key_file
        if not config.hmac_key_file and not config.hmac_key:
            config.hmac_key = EXPLAIN_KEY
        cluster = load_objects(args.cluster)
        objects = _read_stream(args.pods)
    except (OSError, ValueError, yaml.YAMLError) as exc:
        print(f"gpuledger explain: {exc}", file=sys.stderr)
        return 2
    results = asyncio.run(explain_pods(cluster, objects, config, args.now))
    if args.output == "json":
        print(json.dumps(results, indent=2))
    else:
        print(_text(results))
    return 0
