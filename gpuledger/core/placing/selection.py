"""Candidate selection: walk the nodes a strategy offers (or scan them all), keep the best that passes the
filters, and turn that choice into a Placement. Selection only reads the books: it never holds or releases.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuledger.core.books.books import Books, StaticVerdicts
from gpuledger.core.model import Placement, Request, Taint
from gpuledger.core.nodes.node_state import LeafKey, NodeState
from gpuledger.core.placing.filters import Filters, dynamic
from gpuledger.core.plugins.plugin import Fit, ScoreContext, Strategy


@dataclass
class Choice:
    """A node that passes the filters, the devices picked on it, its score and the taints tolerated there."""

    node: NodeState
    fit: Fit
    score: float
    taints: tuple[Taint, ...]


class Selector:
    """The best node (the strategy's score, ties by name) that passes the filters, with its devices."""

    def __init__(self, books: Books, filters: Filters):
        self.books = books
        self.filters = filters

    def try_node(
        self,
        node: NodeState,
        req: Request,
        strategy: Strategy,
        ctx: ScoreContext,
        cache: StaticVerdicts | None = None,
    ) -> Choice | None:
        if not node.placeable:
            return None
        if cache is None:
            cache = self.filters.static_cache(req)
        hit = cache.get(node.name)
        if hit is None:
            hit = cache[node.name] = self.filters.static_uncached(node, req)
        reason, taints = hit
        if reason is not None:
            return None
        fit, reasons = dynamic(node, req, strategy, ctx)
        if reasons:
            return None
        return Choice(node, fit, strategy.score(node, req, fit, ctx), taints)

    def domain_leaves(self, domain: str | None) -> list[LeafKey] | None:
        if not domain or domain in ("leaf", "spine"):
            return None
        leaves = [key for key in self.books.index.leaves if key[1] == domain or key[0] == domain]
        return sorted(leaves) or None

    def select(
        self,
        req: Request,
        strategy: Strategy,
        ctx: ScoreContext,
        leaves: list[LeafKey] | None,
        exclude: set[str] = frozenset(),  # type: ignore[assignment]
    ) -> Choice | None:
        cache = self.filters.static_cache(req)
        if req.latency_sensitive:
            return self.select_least_loaded_leaf(req, strategy, ctx, leaves, exclude)
        walk = strategy.candidates(req, ctx, leaves)
        if walk is not None:
            for node in walk:
                if node.name in exclude:
                    continue
                choice = self.try_node(node, req, strategy, ctx, cache)
                if choice is not None:
                    return choice
            return None
        wanted = None if leaves is None else set(leaves)
        best: Choice | None = None
        for node in self.books.index.nodes.values():
            if (wanted is not None and node.leaf_key not in wanted) or node.name in exclude:
                continue
            choice = self.try_node(node, req, strategy, ctx, cache)
            if choice is None:
                continue
            if (
                best is None
                or choice.score > best.score
                or (choice.score == best.score and node.name < best.node.name)
            ):
                best = choice
        return best

    def select_least_loaded_leaf(self, req, strategy, ctx, leaves, exclude) -> Choice | None:
        """A latency-sensitive request: every node is scored (no walk), and equal scores go to the node in the
        least utilized leaf, then the lowest name."""
        cache = self.filters.static_cache(req)
        wanted = None if leaves is None else set(leaves)
        best: tuple[float, float, str] | None = None
        chosen: Choice | None = None
        for node in self.books.index.nodes.values():
            if (wanted is not None and node.leaf_key not in wanted) or node.name in exclude:
                continue
            choice = self.try_node(node, req, strategy, ctx, cache)
            if choice is None:
                continue
            rank = (-choice.score, ctx.leaf_utilization(node.leaf_key), node.name)
            if best is None or rank < best:
                best, chosen = rank, choice
        return chosen

    def select_soft_domain(self, req, strategy, ctx, exclude=frozenset()) -> Choice | None:
        """The preferred domain is soft: search inside it first, then everywhere."""
        leaves = self.domain_leaves(req.preferred_domain)
        if leaves is not None:
            choice = self.select(req, strategy, ctx, leaves, exclude)
            if choice is not None:
                return choice
        return self.select(req, strategy, ctx, None, exclude)


def device_uuids(node: NodeState, indices: Iterable[int]) -> tuple[str, ...]:
    """The uuids of the given physical device indices on a node; () when the node reports none."""
    out = []
    for d in indices:
        p = node.pos.get(d)
        out.append(node.info.devices[p].uuid if p is not None else "")
    return tuple(out) if any(out) else ()


def placement(req: Request, choice: Choice, strategy_name: str, **extra) -> Placement:
    """The Placement a choice makes for a request."""
    fit = choice.fit
    return Placement(
        id=req.id,
        node=choice.node.name,
        devices=fit.devices,
        shares=fit.shares,
        uuids=device_uuids(choice.node, [*fit.devices, *(s.device for s in fit.shares)]),
        cpu_milli=req.cpu_milli,
        memory_mib=req.memory_mib,
        strategy=strategy_name,
        score=float(choice.score),
        tolerated_taints=choice.taints,
        **extra,
    )
