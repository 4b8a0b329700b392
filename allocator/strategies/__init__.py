"""Placement strategies: a registry of per-node scorers, each with an optional best-first candidate walk.

The ledger filters nodes (readiness, taints, selectors, product, resources), asks the strategy to choose
devices on each feasible node, and keeps the node with the highest `score`, ties broken by the lowest
node name. A strategy whose order follows the whole-free-GPU buckets also provides `candidates`, a walk
in exactly that order, so the ledger stops at the first node that fits instead of scanning every node.
See docs/allocator.md for each strategy's rule.
"""

from __future__ import annotations

import heapq
import importlib
import zlib
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Mapping

from allocator.core.model import MILLI_PER_GPU, DeviceShare, Reason, Request
from allocator.core.plugin import (  # noqa: F401  (re-exported: the strategies' shared interface)
    DEFAULT_BALANCED_WEIGHTS,
    Fit,
    ScoreContext,
    Strategy,
    choose_share_device,
    choose_whole_devices,
    default_choose_devices,
    device_ok,
    product_matches,
)
from allocator.core.registry import (  # noqa: F401  (re-exported)
    accepted_names,
    canonical_name,
    get_strategy,
    register,
    strategy_names,
)

if TYPE_CHECKING:
    from allocator.core.inventory import ClusterIndex, LeafKey, NodeState

def bucket_walk(
    index: "ClusterIndex", leaves: list["LeafKey"] | None, need: int, descending: bool
) -> Iterator["NodeState"]:
    """Placeable nodes with at least `need` whole-free GPUs, by whole-free count then name."""
    nodes = index.nodes
    if leaves is None:
        by_free = index.all.by_free
        for k in index.all.keys_from(need, descending):
            for name in by_free[k]:  # the ledger mutates nothing while it walks
                yield nodes[name]
        return
    groups = [index.leaves[leaf] for leaf in leaves if leaf in index.leaves]
    for k in index.all.keys_from(need, descending):  # the global keys hold every leaf's keys
        lists = [lst for g in groups if (lst := g.by_free.get(k))]
        if not lists:
            continue
        if len(lists) == 1:
            for name in lists[0]:
                yield nodes[name]
            continue
        # the first node is usually taken: find it without building the merge (names are unique)
        first = min(lst[0] for lst in lists)
        yield nodes[first]
        merged = heapq.merge(*lists)
        next(merged)
        for name in merged:
            yield nodes[name]


def leaf_walk(
    index: "ClusterIndex",
    leaves: list["LeafKey"] | None,
    need: int,
    leaf_descending: bool,
    node_descending: bool,
) -> Iterator["NodeState"]:
    """Leaves ordered by their whole-free total (equal totals merged by node name), nodes by bucket.
    A leaf whose total is below `need` cannot hold a node with `need` free, so it is skipped unseen."""
    wanted = None if leaves is None else set(leaves)
    groups = index.leaves_by_total
    for total in sorted(groups, reverse=leaf_descending):
        if total < need or not groups.get(total):
            continue
        first = None
        if wanted is None and node_descending:
            # the tied group's first node, from the index's per-total heads (merging 100s of leaves for the
            # node that is usually taken is what made spreading slow); the merged walk only if it is refused
            first = index.first_most_free(total)
            if first is None or first[0] < need:
                continue  # no node in these leaves has `need` free
            yield index.nodes[first[1]]
        members = list(groups[total]) if wanted is None else list(groups[total] & wanted)  # merged by name
        if members:
            for node in bucket_walk(index, members, need, node_descending):
                if first is None or node.name != first[1]:
                    yield node


def _taken_milli(request: Request) -> int:
    return request.gpus * MILLI_PER_GPU if request.gpus > 0 else request.gpu_milli


def best_fit_cost(node: "NodeState", request: Request, index: "ClusterIndex") -> int:
    """best fit's node cost as an exact integer: `fit_key` after placement (lower is a tighter fit)."""
    return (node.cpu_free - request.cpu_milli) * index.max_gpu_milli + (
        node.free_milli - _taken_milli(request)
    ) * index.max_cpu_milli


def best_fit_walk(
    index: "ClusterIndex", leaves: list["LeafKey"] | None, request: Request
) -> Iterator["NodeState"]:
    """Placeable nodes by best-fit cost, then name, skipping nodes that cannot hold the request's CPU, memory
    or GPU amount. The cost is `fit_key` less a constant, so each whole-free bucket is already in cost order:
    merging the buckets with `need` or more free GPUs is exact, and the first node that fits is the best."""
    need = request.gpus
    cpu, mem, taken = request.cpu_milli, request.memory_mib, _taken_milli(request)
    nodes = index.nodes

    def fits(node: "NodeState") -> bool:
        return node.cpu_free >= cpu and node.mem_free >= mem and node.free_milli_raw >= taken  # all must hold

    if leaves is not None:  # a few leaves: sort their nodes outright
        picked = []
        for leaf in leaves:
            b = index.leaves.get(leaf)
            if b is None:
                continue
            for k, names in b.by_free.items():
                if k >= need:
                    picked.extend(nodes[name] for name in names)
        picked.sort(key=lambda node: (best_fit_cost(node, request, index), node.name))
        yield from filter(fits, picked)
        return
    by_fit = index.fit_buckets()
    heads = [(entries[0], k, 0) for k, entries in by_fit.items() if k >= need and entries]
    heapq.heapify(heads)
    while heads:
        entry, k, i = heads[0]
        node = nodes[entry[1]]
        entries = by_fit[k]
        if i + 1 < len(entries):
            heapq.heapreplace(heads, (entries[i + 1], k, i + 1))
        else:
            heapq.heappop(heads)
        if node.cpu_free >= cpu and node.mem_free >= mem and node.free_milli_raw >= taken:  # fits(), inlined
            yield node


class BestFit(Strategy):
    """The tightest node counting CPU and GPU (Weng et al. ATC'23's BestFit): lowest free CPU after / the
    cluster's largest node CPU + free milli-GPU after / its largest node GPU capacity, ties by name; on the
    node, the shortest free run of whole GPUs, or the fullest device that holds a share."""

    name = "best_fit"

    def score(self, node, request, fit, ctx):
        index = ctx.index
        return -best_fit_cost(node, request, index) / (2.0 * index.max_cpu_milli * index.max_gpu_milli)

    def candidates(self, request, ctx, leaves):
        if type(self).score is not BestFit.score:
            return None
        return best_fit_walk(ctx.index, leaves, request)


class LeastUtilized(Strategy):
    """Most free whole GPUs (for shares: most free milli-GPU on the node) — spreads load."""

    name = "least_utilized"

    def score(self, node, request, fit, ctx):
        if request.gpus > 0:
            return float(node.whole_free)
        return float(node.free_milli)

    def candidates(self, request, ctx, leaves):
        if request.gpus > 0:
            return bucket_walk(ctx.index, leaves, request.gpus, descending=True)
        return None


class Consolidated(Strategy):
    """Pack: the leaf with the least free capacity first, then the fullest node in it."""

    name = "consolidated"

    def score(self, node, request, fit, ctx):
        leaf = ctx.index.leaves[node.leaf_key]
        if request.gpus > 0:
            return -float(leaf.total_whole * 1024 + node.whole_free)
        return -(leaf.free_milli * 10000.0 + node.free_milli)

    def candidates(self, request, ctx, leaves):
        if request.gpus > 0:
            return leaf_walk(ctx.index, leaves, request.gpus, leaf_descending=False, node_descending=False)
        return None


class Distributed(Strategy):
    """Spread: the leaf with the most free capacity first, then the emptiest node in it."""

    name = "distributed"

    def score(self, node, request, fit, ctx):
        leaf = ctx.index.leaves[node.leaf_key]
        if request.gpus > 0:
            return float(leaf.total_whole * 1024 + node.whole_free)
        return leaf.free_milli * 10000.0 + node.free_milli

    def candidates(self, request, ctx, leaves):
        if request.gpus > 0:
            return leaf_walk(ctx.index, leaves, request.gpus, leaf_descending=True, node_descending=True)
        return None


class RoundRobin(Strategy):
    """The next node by name after the one the previous round-robin placement took (wrapping)."""

    name = "round_robin"

    def _ring(self, ctx):
        names = ctx.index.sorted_names()
        return names, bisect_right(names, ctx.rr_cursor) if ctx.rr_cursor else 0

    def score(self, node, request, fit, ctx):
        names, start = self._ring(ctx)
        rank = bisect_right(names, node.name) - 1
        return -float((rank - start) % max(1, len(names)))

    def candidates(self, request, ctx, leaves):
        names, start = self._ring(ctx)
        wanted = None if leaves is None else set(leaves)
        nodes = ctx.index.nodes

        def walk():
            for name in names[start:] + names[:start]:
                node = nodes[name]
                if wanted is None or node.leaf_key in wanted:
                    yield node

        return walk()


class Priority(BestFit):
    """Best fit, but a request below priority 1 may not take GPU capacity that would leave less than
    `priority_headroom` of the cluster's GPU capacity free; that headroom is for priority >= 1."""

    name = "priority"

    def admit(self, request, ctx):
        if request.priority >= 1:
            return None
        need = request.gpus * MILLI_PER_GPU if request.gpus else request.gpu_milli
        keep = ctx.priority_headroom * ctx.cluster_total_milli
        if ctx.cluster_free_milli - need < keep:
            return Reason.PRIORITY_HEADROOM
        return None


class RandomChoice(Strategy):
    """A pseudo-random node, stable for a given (seed, request id)."""

    name = "random"

    def score(self, node, request, fit, ctx):
        return float(zlib.crc32(f"{ctx.seed}:{ctx.request_id}:{node.name}".encode()))


class CostOptimized(BestFit):
    """Nodes labelled gpu-orchestrator/cheap-node=true first, best fit among equals."""

    name = "cost_optimized"

    def score(self, node, request, fit, ctx):
        return (1e9 if node.info.cheap else 0.0) + super().score(node, request, fit, ctx)

    def candidates(self, request, ctx, leaves):
        return None


class Balanced(Strategy):
    """Weighted sum of resource availability, topology alignment, leaf (domain) utilization and history."""

    name = "balanced"

    def score(self, node, request, fit, ctx):
        w = ctx.balanced_weights
        taken = request.gpus * MILLI_PER_GPU + sum(s.milli for s in fit.shares)
        availability = (node.free_milli - taken) / node.total_milli if node.total_milli else 0.0
        domain = request.preferred_domain
        if domain and domain not in ("leaf", "spine"):
            alignment = 1.0 if node.info.leaf == domain else 0.75 if node.info.spine == domain else 0.0
        else:
            devs = sorted(fit.devices)
            alignment = 1.0 if not devs or devs[-1] - devs[0] == len(devs) - 1 else 0.5
        domain_free = 1.0 - ctx.leaf_utilization(node.leaf_key)
        history = min(1.0, max(0.0, float(ctx.performance.get(node.name, 1.0))))
        return (
            w.get("resourceAvailability", 0.0) * availability
            + w.get("topologyAlignment", 0.0) * alignment
            + w.get("domainUtilization", 0.0) * domain_free
            + w.get("historicalPerformance", 0.0) * history
        )


class Explicit(BestFit):
    """The `gpu-scheduling-map`: a request with `pinned` goes exactly there; without one, best fit."""

    name = "explicit"


def _import_optional(module: str) -> None:
    """Import a core module that registers strategies on import, if it exists yet."""
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as err:
        if err.name != module:
            raise


def _register_builtin() -> None:
    register("best_fit", BestFit, aliases=("bestfit", "binpack", "bin-pack"))
    register("least_utilized", LeastUtilized, aliases=("leastLoaded", "least_loaded", "leastUtilized"))
    register("round_robin", RoundRobin, aliases=("roundRobin",))
    register("priority", Priority, aliases=("priority_based", "priorityBased"))
    register("random", RandomChoice)
    register("cost_optimized", CostOptimized, aliases=("costOptimized", "cost"))
    register("consolidated", Consolidated, aliases=("pack", "packed", "consolidate"))
    register("distributed", Distributed, aliases=("spread", "distribute"))
    register("balanced", Balanced)
    register("explicit", Explicit, aliases=("explicit_map", "gpu-scheduling-map", "map"))
    # strategies defined in other core modules register themselves on import (one line each):
    _import_optional("allocator.strategies.fragmentation")


_register_builtin()
