"""The node a placement names, written as the pod's binding mode says: `nodeName` (the scheduler is skipped)
and/or a required node affinity term the scheduler then honours. A gated pod may not get a nodeName, so the
placement adapter always writes the affinity; the webhook writes what its `binding_mode` says."""

from __future__ import annotations

from typing import Any

from gpuledger.core.model import BindingMode
from gpuledger.podwrite.copy_on_write import copied, list_at

# the one node field a selector term can match: nodes whose hostname label is not their name are named by it
NAME_FIELD = "metadata.name"


def with_node(affinity: Any, node: str, key: str) -> dict:
    """`affinity` (a pod's, as read) with `node` ANDed into every required node selector term, or a new term
    when there is none: the terms are ORed and the ledger chose a node matching one of them, and a gated pod
    may only add requirements to its terms. `key` metadata.name writes matchFields, any other key
    matchExpressions. Copy-on-write: `affinity` is not changed, members off the path stay shared."""
    out = dict(affinity) if isinstance(affinity, dict) else {}
    node_affinity = copied(out, "nodeAffinity")
    required = copied(node_affinity, "requiredDuringSchedulingIgnoredDuringExecution")
    field = "matchFields" if key == NAME_FIELD else "matchExpressions"
    requirement = {"key": key, "operator": "In", "values": [node]}
    terms = []
    for term in list_at(required, "nodeSelectorTerms") or [{}]:
        term = dict(term) if isinstance(term, dict) else {}
        requirements = list_at(term, field)
        if requirement not in requirements:  # a reinvocation (or a second write) finds it already there
            term[field] = [*requirements, requirement]
        terms.append(term)
    required["nodeSelectorTerms"] = terms
    return out


def bind(spec: dict, node: str, mode: BindingMode, key: str) -> None:
    """Write `node` into `spec` (a copy the caller may write) as binding `mode` says."""
    if mode in (BindingMode.NODE_NAME, BindingMode.BOTH):
        spec["nodeName"] = node
    if mode in (BindingMode.AFFINITY, BindingMode.BOTH):
        spec["affinity"] = with_node(spec.get("affinity"), node, key)
