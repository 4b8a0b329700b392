"""Per-node filters: the static verdicts (readiness, product, GPU memory, selectors, taints), cached per
request shape and node, and the dynamic one (free cpu, memory and devices), read from the node's free state.
Filters judge one node for one request: they never choose between nodes and never change what is held.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TypeVar

from gpuledger.core.books.books import Books, StaticVerdicts
from gpuledger.core.model import MILLI_PER_GPU, NodeInfo, Placement, Reason, Request, Taint
from gpuledger.core.nodes.inventory import BANDWIDTH_LABELS, ClusterIndex
from gpuledger.core.nodes.node_state import NodeState
from gpuledger.core.plugins.plugin import ScoreContext, Strategy, device_ok, product_matches
from gpuledger.core.pods.annotation_values import node_bandwidth_gbps
from gpuledger.names import (
    ACCELERATOR_LABEL,
    AGENT_NETWORK_BANDWIDTH_LABEL,
    NETWORK_BANDWIDTH,
    NETWORK_BANDWIDTH_LABEL,
)

HARD_EFFECTS = ("NoSchedule", "NoExecute")
FILTER_CACHE_LIMIT = 256


class Filters:
    """The static filter cache over the books' nodes, and what a strategy may know beyond one node."""

    def __init__(self, books: Books):
        self.books = books

    def context(self, request: Request) -> ScoreContext:
        books = self.books
        return ScoreContext(
            index=books.index,
            seed=request.seed,
            request_id=request.id,
            rr_cursor=books.rr_cursor,
            priority_headroom=books.config.priority_headroom,
            balanced_weights=books.config.balanced_weights,
            performance=books.performance,
            extra=books.context_extra,
            now=books.last_now,
            utilization_max_age_s=getattr(books.config, "utilization_max_age_s", 120.0),
        )

    def static(self, node: NodeState, req: Request) -> tuple[Reason | None, tuple[Taint, ...]]:
        """Reasons that do not change with allocations (cached per request shape and node)."""
        cache = self.static_cache(req)
        hit = cache.get(node.name)
        if hit is None:
            hit = cache[node.name] = self.static_uncached(node, req)
        return hit

    def static_cache(self, req: Request) -> StaticVerdicts:
        return self.books.filter_verdicts(static_signature(req), FILTER_CACHE_LIMIT)

    def static_uncached(self, node: NodeState, req: Request) -> tuple[Reason | None, tuple[Taint, ...]]:
        info = node.info
        if not info.ready or info.unschedulable:
            return Reason.NOT_READY, ()
        if req.needs_gpu and not info.gpu_schedulable:
            return Reason.NOT_GPU_SCHEDULABLE, ()
        if req.product and not product_matches(
            req.product,
            info.product,
            info.label(ACCELERATOR_LABEL, "") or "",
            *(d.product for d in info.devices),
        ):
            return Reason.PRODUCT_MISMATCH, ()
        if req.gpu_memory_mib and req.needs_gpu:
            sizes = [d.memory_mib for d in info.devices if d.healthy]
            if sizes and all(s and s < req.gpu_memory_mib for s in sizes):
                return Reason.GPU_MEMORY_TOO_SMALL, ()
        if req.network_bandwidth_gbps is not None:
            have = node_bandwidth(info)
            if have is None or have < req.network_bandwidth_gbps:
                return Reason.NETWORK_BANDWIDTH, ()
        if req.node_selector or req.affinity_terms:
            labels = info.label_map
            if any(labels.get(k) != v for k, v in req.node_selector):
                return Reason.SELECTOR, ()
            if req.affinity_terms and not any(
                all(requirement_matches(r, labels) for r in term) for term in req.affinity_terms
            ):
                return Reason.SELECTOR, ()
        tolerated: list[Taint] = []
        for taint in info.taints:
            if taint.effect not in HARD_EFFECTS or any(t.tolerates(taint) for t in req.tolerations):
                continue
            if req.needs_gpu and taint.key in self.books.config.tolerated_gpu_taint_keys:
                tolerated.append(taint)
                continue
            return Reason.TAINT, ()
        return None, tuple(tolerated)


def node_bandwidth(info: NodeInfo) -> float | None:
    """The node's bandwidth in Gbit/s: the operator's label where the node has it (an unreadable one meets
    no request), else the node agent's; None when neither says."""
    for key in BANDWIDTH_LABELS:
        value = info.label(key)
        if value is not None:
            return node_bandwidth_gbps(value)
    return None


def bandwidth_unchecked(req: Request, index: ClusterIndex) -> tuple[Request, str]:
    """A minimum bandwidth is checked only where some node says its bandwidth. Where none does (a cluster
    nobody labelled, without the node agent's reading), the request without it and a warning naming the
    label; else the request as it is and ""."""
    if req.network_bandwidth_gbps is None or index.bandwidth_nodes:
        return req, ""
    warning = (
        f"{NETWORK_BANDWIDTH} {req.network_bandwidth_gbps:g}Gb not checked: no node has the label "
        f"{NETWORK_BANDWIDTH_LABEL} (or the node agent's {AGENT_NETWORK_BANDWIDTH_LABEL}); label the nodes "
        "to enforce it"
    )
    return replace(req, network_bandwidth_gbps=None), warning


Answer = TypeVar("Answer")


def with_warning(answer: Answer, warning: str) -> Answer:
    """A placement with `warning` added to what admission tells the user; any other answer as it is."""
    if warning and isinstance(answer, Placement):
        return replace(answer, warnings=(*answer.warnings, warning))
    return answer


def dynamic(node: NodeState, req: Request, strategy: Strategy, ctx: ScoreContext):
    """(fit, reasons) from the node's current free state."""
    reasons = []
    if req.latency_sensitive and any(node.dev_nshares):
        reasons.append(Reason.SHARED_GPUS)  # a latency-sensitive pod takes no node whose GPUs others share
    if node.cpu_free < req.cpu_milli:
        reasons.append(Reason.NOT_ENOUGH_CPU)
    if node.mem_free < req.memory_mib:
        reasons.append(Reason.NOT_ENOUGH_MEMORY)
    fit = strategy.choose_devices(node, req, ctx)
    if fit is None:
        if req.gpus > 0:
            ndev = len(node.dev_index)
            if not req.product and not req.gpu_memory_mib and node.total_milli == ndev * MILLI_PER_GPU:
                usable = ndev  # every device healthy and nothing else asked of them
            else:
                usable = sum(1 for p in range(ndev) if device_ok(node, p, req))
            if node.external and node.whole_free + external_free(node) >= req.gpus:
                reasons.append(Reason.EXTERNAL_GPU_USE)  # it would fit but for processes outside Kubernetes
            elif usable < req.gpus <= ndev:
                reasons.append(Reason.UNHEALTHY_DEVICE)
            else:
                reasons.append(Reason.NOT_ENOUGH_GPUS)
        else:
            reasons.append(Reason.NOT_ENOUGH_GPU_SHARE)
    return fit, reasons


def external_free(node: NodeState) -> int:
    """Devices nobody in the ledger holds that processes outside Kubernetes use (not placed on)."""
    pos = node.pos
    return sum(
        1
        for d in node.external
        if d in pos and node.dev_owner[pos[d]] is None and not node.dev_nshares[pos[d]]
    )


def unplaceable_reason(node: NodeState) -> Reason:
    """Why a node that is not placeable takes nothing."""
    info = node.info
    return Reason.NOT_READY if (not info.ready or info.unschedulable) else Reason.NOT_GPU_SCHEDULABLE


def tolerated_gpu_taints(node: NodeState, keys: tuple[str, ...]) -> tuple[Taint, ...]:
    """The node's hard GPU taints the ledger tolerates on a pod's behalf."""
    return tuple(t for t in node.info.taints if t.effect in HARD_EFFECTS and t.key in keys)


def static_signature(req: Request) -> tuple:
    """What the static filters read from a request: requests equal here get the same static verdicts."""
    return (
        req.product,
        req.gpu_memory_mib,
        req.gpus > 0,
        req.needs_gpu,
        req.node_selector,
        req.affinity_terms,
        req.tolerations,
        req.network_bandwidth_gbps,
        req.latency_sensitive,
    )


def requirement_matches(req, labels: dict[str, str]) -> bool:
    value = labels.get(req.key)
    op = req.operator
    if op == "In":
        return value is not None and value in req.values
    if op == "NotIn":
        return value is None or value not in req.values
    if op == "Exists":
        return value is not None
    if op == "DoesNotExist":
        return value is None
    if op in ("Gt", "Lt"):
        try:
            have, bound = int(value), int(req.values[0])  # type: ignore[arg-type]
        except (TypeError, ValueError, IndexError):
            return False
        return have > bound if op == "Gt" else have < bound
    return False
