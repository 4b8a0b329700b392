"""The GPU ledger: one consistent view of every node's free GPUs, and the reservations that use them.

Admission asks `reserve`; the cluster's own objects (`apply_object`/`delete_object`) confirm, count and
release; unconfirmed reservations `expire` after a TTL. Everything is keyed by the caller's id, `now` is an
argument, and `rebuild(objects)` reproduces the live state from nodes and pods alone (`snapshot()`
equality), because every placement is also written, signed, on its pod.
"""

from __future__ import annotations

import gc
from bisect import bisect_left, insort
from collections import Counter, OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any, Iterable

from allocator.core import objects as kube
from allocator.core.inventory import ClusterIndex, Holding, LeafKey, NodeState
from allocator.core.model import (
    MILLI_PER_GPU,
    Denial,
    DeviceShare,
    Explanation,
    GroupSlot,
    NearMiss,
    NodeInfo,
    NodeScore,
    Placement,
    Reason,
    ReservationState,
    Request,
    Taint,
)
from allocator.core.plugin import DEFAULT_BALANCED_WEIGHTS, Fit, ScoreContext, Strategy, device_ok, product_matches
from allocator.core.registry import canonical_name, get_strategy
from allocator.core.topology import Topology, plan_leaves

_HARD_EFFECTS = ("NoSchedule", "NoExecute")
_FILTER_CACHE_LIMIT = 256
_DIAGNOSIS_LIMIT = 16  # request shapes whose denial diagnosis is kept current
_NEAR_MISSES = 3


@dataclass
class LedgerConfig:
    default_strategy: str = "best_fit"
    reservation_ttl_s: float = 30.0  # unconfirmed reservations expire after this
    tolerated_gpu_taint_keys: tuple[str, ...] = ("nvidia.com/gpu",)  # tolerated on the pod's behalf
    spine_label: str = "topology.scheduler/spine"
    leaf_label: str = "topology.scheduler/leaf"
    leaf_order: tuple[str, ...] = ()  # empty = natural sort of label values
    priority_headroom: float = 0.1  # share of GPU capacity kept for priority >= 1 (strategy `priority`)
    balanced_weights: dict = field(default_factory=lambda: dict(DEFAULT_BALANCED_WEIGHTS))
    placement_key: bytes = b""  # HMAC key for placement annotations (empty = unsigned, dev only)


@dataclass(frozen=True)
class DomainStats:
    """Totals of one leaf or spine."""

    spine: str
    leaf: str  # "" for a spine
    nodes: int
    gpus: int  # healthy devices on placeable nodes
    milli_total: int
    milli_free: int
    whole_free: int

    @property
    def utilization(self) -> float:
        return 1.0 - self.milli_free / self.milli_total if self.milli_total else 0.0

    @property
    def fragmentation(self) -> float:
        """Share of free capacity that no whole-GPU request can use (free milli outside whole-free GPUs)."""
        if not self.milli_free:
            return 0.0
        return max(0.0, 1.0 - self.whole_free * MILLI_PER_GPU / self.milli_free)


@dataclass(frozen=True)
class LedgerStats:
    nodes: int
    placeable_nodes: int
    gpus_total: int  # devices on all nodes
    gpus_healthy: int
    milli_total: int  # healthy devices on placeable nodes
    milli_allocated: int
    whole_free: int
    reservations_pending: int
    reservations_confirmed: int
    groups: int
    unclaimed_slots: int
    leaves: tuple[DomainStats, ...] = ()
    spines: tuple[DomainStats, ...] = ()

    @property
    def fragmentation(self) -> float:
        free = self.milli_total - self.milli_allocated
        return max(0.0, 1.0 - self.whole_free * MILLI_PER_GPU / free) if free else 0.0

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("leaves", "spines")}
        d["fragmentation"] = self.fragmentation
        for name in ("leaves", "spines"):
            d[name] = [
                {**s.__dict__, "utilization": s.utilization, "fragmentation": s.fragmentation}
                for s in getattr(self, name)
            ]
        return d


@dataclass
class Reservation:
    placement: Placement
    state: ReservationState
    created: float


@dataclass
class GroupState:
    """A gang: its slots (slot -> GroupSlot) and who claimed each (None = unclaimed, held for the group)."""

    key: str
    slots: dict[int, GroupSlot]
    claims: dict[int, str | None]
    deadline: float
    cpu_milli: int = 0
    memory_mib: int = 0
    strategy: str = ""
    slot_taints: dict[int, tuple[Taint, ...]] = field(default_factory=dict)  # taints tolerated per slot

    def plan(self) -> tuple[GroupSlot, ...]:
        return tuple(self.slots[s] for s in sorted(self.slots))


def slot_hid(group: str, slot: int) -> str:
    """Holder id of an unclaimed group slot (also what `expiry_candidates` lists for it)."""
    return f"{group}#slot{slot}"


@dataclass
class _Choice:
    node: NodeState
    fit: Fit
    score: float
    taints: tuple[Taint, ...]


class Ledger:
    def __init__(self, config: LedgerConfig | None = None):
        self.config = config or LedgerConfig()
        self.index = ClusterIndex()
        self.performance: dict[str, float] = {}  # node -> historical performance in [0, 1] (balanced)
        self.context_extra: dict[str, Any] = {}  # inputs for plug-in strategies
        self.problems: deque[str] = deque(maxlen=200)  # malformed cluster data seen, newest last
        self._holdings: dict[str, Holding] = {}
        self._node_holders: dict[str, set[str]] = {}
        self._reservations: dict[str, Reservation] = {}
        self._groups: dict[str, GroupState] = {}
        self._slot_of: dict[str, tuple[str, int]] = {}  # holder id (claimer or unclaimed slot) -> (group, slot)
        self._pods: dict[str, str] = {}  # pod key -> holder id
        self._rr_cursor = ""
        self._last_now = float("-inf")
        self._filter_cache: dict[tuple, dict[str, tuple[Reason | None, tuple[Taint, ...]]]] = {}
        self._topology: Topology | None = None
        self._diagnoses: OrderedDict[tuple, _Diagnosis] = OrderedDict()  # request shape -> diagnosis, LRU

    # ------------------------------------------------------------------------------------------ inventory
    def upsert_node(self, node: NodeInfo) -> None:
        old = self.index.nodes.get(node.name)
        if old is not None and old.info == node:
            return
        if old is not None:
            self.index.remove(node.name)
        if old is None or old.leaf_key != (node.spine, node.leaf):
            self._topology = None
        state = NodeState(node)
        for hid in sorted(self._node_holders.get(node.name, ())):
            state.apply(self._holdings[hid])
        self.index.add(state)
        for cache in self._filter_cache.values():
            cache.pop(node.name, None)

    def remove_node(self, name: str) -> None:
        """Forget a node's capacity; what is held on it stays recorded and returns if the node does."""
        if self.index.remove(name) is not None:
            self._topology = None
            for cache in self._filter_cache.values():
                cache.pop(name, None)

    def topology(self) -> Topology:
        if self._topology is None:
            leaves = list(self.index.leaf_members)
            self._topology = Topology.build(leaves, self.config.leaf_order)
        return self._topology

    # ------------------------------------------------------------------------------------------ holdings
    def _hold(self, h: Holding) -> None:
        self._holdings[h.id] = h
        self._node_holders.setdefault(h.node, set()).add(h.id)
        node = self.index.nodes.get(h.node)
        if node is not None:
            self.index.change(node, lambda: node.apply(h))

    def _unhold(self, hid: str) -> Holding | None:
        h = self._holdings.pop(hid, None)
        if h is None:
            return None
        holders = self._node_holders.get(h.node)
        if holders is not None:
            holders.discard(hid)
            if not holders:
                del self._node_holders[h.node]
        node = self.index.nodes.get(h.node)
        if node is not None:
            self.index.change(node, lambda: node.remove(hid))
        return h

    def _uuids(self, node: NodeState, indices: Iterable[int]) -> tuple[str, ...]:
        out = []
        for d in indices:
            p = node.pos.get(d)
            out.append(node.info.devices[p].uuid if p is not None else "")
        return tuple(out) if any(out) else ()

    # ------------------------------------------------------------------------------------------ filters
    def _context(self, request: Request) -> ScoreContext:
        return ScoreContext(
            index=self.index,
            seed=request.seed,
            request_id=request.id,
            rr_cursor=self._rr_cursor,
            priority_headroom=self.config.priority_headroom,
            balanced_weights=self.config.balanced_weights,
            performance=self.performance,
            extra=self.context_extra,
        )

    def _static(self, node: NodeState, req: Request) -> tuple[Reason | None, tuple[Taint, ...]]:
        """Reasons that do not change with allocations (cached per request shape and node)."""
        cache = self._static_cache(req)
        hit = cache.get(node.name)
        if hit is None:
            hit = cache[node.name] = self._static_uncached(node, req)
        return hit

    def _static_cache(self, req: Request) -> dict[str, tuple[Reason | None, tuple[Taint, ...]]]:
        sig = _static_signature(req)
        cache = self._filter_cache.get(sig)
        if cache is None:
            if len(self._filter_cache) >= _FILTER_CACHE_LIMIT:
                self._filter_cache.clear()
            cache = self._filter_cache[sig] = {}
        return cache

    def _static_uncached(self, node: NodeState, req: Request) -> tuple[Reason | None, tuple[Taint, ...]]:
        info = node.info
        if not info.ready or info.unschedulable:
            return Reason.NOT_READY, ()
        if req.needs_gpu and not info.gpu_schedulable:
            return Reason.NOT_GPU_SCHEDULABLE, ()
        if req.product and not product_matches(
            req.product, info.product, info.label(kube.ACCELERATOR_LABEL, ""), *(d.product for d in info.devices)
        ):
            return Reason.PRODUCT_MISMATCH, ()
        if req.gpu_memory_mib and req.needs_gpu:
            sizes = [d.memory_mib for d in info.devices if d.healthy]
            if sizes and all(s and s < req.gpu_memory_mib for s in sizes):
                return Reason.GPU_MEMORY_TOO_SMALL, ()
        if req.node_selector or req.affinity_terms:
            labels = info.label_map
            if any(labels.get(k) != v for k, v in req.node_selector):
                return Reason.SELECTOR, ()
            if req.affinity_terms and not any(
                all(_requirement_matches(r, labels) for r in term) for term in req.affinity_terms
            ):
                return Reason.SELECTOR, ()
        tolerated: list[Taint] = []
        for taint in info.taints:
            if taint.effect not in _HARD_EFFECTS or any(t.tolerates(taint) for t in req.tolerations):
                continue
            if req.needs_gpu and taint.key in self.config.tolerated_gpu_taint_keys:
                tolerated.append(taint)
                continue
            return Reason.TAINT, ()
        return None, tuple(tolerated)

    def _dynamic(self, node: NodeState, req: Request, strategy: Strategy, ctx: ScoreContext):
        """(fit, reasons) from the node's current free state."""
        reasons = []
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
                if usable < req.gpus <= ndev:
                    reasons.append(Reason.UNHEALTHY_DEVICE)
                else:
                    reasons.append(Reason.NOT_ENOUGH_GPUS)
            else:
                reasons.append(Reason.NOT_ENOUGH_GPU_SHARE)
        return fit, reasons

    def _try(self, node: NodeState, req: Request, strategy: Strategy, ctx: ScoreContext, cache=None) -> _Choice | None:
        if not node.placeable:
            return None
        if cache is None:
            cache = self._static_cache(req)
        hit = cache.get(node.name)
        if hit is None:
            hit = cache[node.name] = self._static_uncached(node, req)
        reason, taints = hit
        if reason is not None:
            return None
        fit, reasons = self._dynamic(node, req, strategy, ctx)
        if reasons:
            return None
        return _Choice(node, fit, strategy.score(node, req, fit, ctx), taints)

    def _domain_leaves(self, domain: str | None) -> list[LeafKey] | None:
        if not domain or domain in ("leaf", "spine"):
            return None
        leaves = [key for key in self.index.leaves if key[1] == domain or key[0] == domain]
        return sorted(leaves) or None

    def _select(
        self,
        req: Request,
        strategy: Strategy,
        ctx: ScoreContext,
        leaves: list[LeafKey] | None,
        exclude: set[str] = frozenset(),  # type: ignore[assignment]
    ) -> _Choice | None:
        cache = self._static_cache(req)
        walk = strategy.candidates(req, ctx, leaves)
        if walk is not None:
            for node in walk:
                if node.name in exclude:
                    continue
                choice = self._try(node, req, strategy, ctx, cache)
                if choice is not None:
                    return choice
            return None
        wanted = None if leaves is None else set(leaves)
        best: _Choice | None = None
        for node in self.index.nodes.values():
            if (wanted is not None and node.leaf_key not in wanted) or node.name in exclude:
                continue
            choice = self._try(node, req, strategy, ctx, cache)
            if choice is None:
                continue
            if best is None or choice.score > best.score or (
                choice.score == best.score and node.name < best.node.name
            ):
                best = choice
        return best

    def _select_soft_domain(self, req, strategy, ctx, exclude=frozenset()) -> _Choice | None:
        """The preferred domain is soft: search inside it first, then everywhere."""
        leaves = self._domain_leaves(req.preferred_domain)
        if leaves is not None:
            choice = self._select(req, strategy, ctx, leaves, exclude)
            if choice is not None:
                return choice
        return self._select(req, strategy, ctx, None, exclude)

    # ------------------------------------------------------------------------------------------ denials
    def _describe(self, req: Request) -> str:
        if req.gpus > 0:
            what = f"{req.gpus} whole GPU(s)"
            if req.gpu_memory_mib:
                what += f" with {req.gpu_memory_mib} MiB each"
        elif req.is_shared:
            parts = []
            if req.gpu_milli:
                parts.append(f"{req.gpu_milli} milli-GPU")
            if req.gpu_memory_mib:
                parts.append(f"{req.gpu_memory_mib} MiB GPU memory")
            what = "a share of " + " and ".join(parts)
        else:
            what = "a pod without GPUs"
        if req.cpu_milli or req.memory_mib:
            what += f" (+{req.cpu_milli}m cpu, {req.memory_mib} MiB memory)"
        if req.product:
            what += f" of product {req.product!r}"
        return what

    def _classify(self, node: NodeState, req: Request, strategy: Strategy, ctx: ScoreContext):
        """(the reason a denial counts the node under, or None when it fits; its near-miss sort key or None)."""
        if not node.placeable:
            info = node.info
            return (Reason.NOT_READY if (not info.ready or info.unschedulable) else Reason.NOT_GPU_SCHEDULABLE), None
        reason, _ = self._static(node, req)
        if reason is not None:
            return reason, None
        _, reasons = self._dynamic(node, req, strategy, ctx)
        if not reasons:
            return None, None
        return reasons[0], (-node.whole_free, -_max_share(node), -node.cpu_free, -node.mem_free, node.name)

    def _near_miss(self, node: NodeState, req: Request, strategy: Strategy, ctx: ScoreContext) -> NearMiss:
        _, reasons = self._dynamic(node, req, strategy, ctx)
        detail = (
            f"has {node.whole_free} free GPU(s), largest free share {_max_share(node)}m, "
            f"{node.cpu_free}m cpu and {node.mem_free} MiB memory free"
        )
        return NearMiss(node.name, tuple(reasons), node.whole_free, detail)

    def _diagnose_full(self, req: Request, strategy: Strategy, ctx: ScoreContext, exclude=frozenset()):
        """(per-reason node counts, the closest near misses, nodes that fit), by classifying every node.
        The reference `_diagnose` must equal; also the path for strategies with their own device choice."""
        counts: Counter[Reason] = Counter()
        misses: list[tuple] = []
        fitting = 0
        for node in self.index.nodes.values():
            if node.name in exclude:
                counts[Reason.LEAF_CONSTRAINT] += 1
                continue
            reason, key = self._classify(node, req, strategy, ctx)
            if reason is None:
                fitting += 1
                continue
            counts[reason] += 1
            if key is not None:
                misses.append(key)
        misses.sort()
        nodes = self.index.nodes
        near = tuple(self._near_miss(nodes[key[-1]], req, strategy, ctx) for key in misses[:_NEAR_MISSES])
        return counts, near, fitting

    def _diagnose(self, req: Request, strategy: Strategy, ctx: ScoreContext, exclude=frozenset()):
        """What `_diagnose_full` answers, from a per-request-shape diagnosis that re-classifies only the nodes
        touched since it was last read (a flood of pods that cannot fit costs O(changes), not O(nodes))."""
        if getattr(type(strategy), "choose_devices", None) is not Strategy.choose_devices:
            return self._diagnose_full(req, strategy, ctx, exclude)  # a device choice that may read the cluster
        diag = self._diagnosis(req, strategy, ctx)
        nodes = self.index.nodes
        counts = Counter({r: n for r, n in diag.counts.items()})
        fitting = diag.fitting
        if exclude:
            excluded = 0
            for name in exclude:
                if name not in nodes:
                    continue
                excluded += 1
                reason = diag.first[name]
                if reason is None:
                    fitting -= 1
                    continue
                left = counts[reason] - 1
                if left:
                    counts[reason] = left
                else:
                    del counts[reason]
            if excluded:
                counts[Reason.LEAF_CONSTRAINT] += excluded
        near = []
        for key in diag.near:
            if len(near) == _NEAR_MISSES:
                break
            name = key[-1]
            if name not in exclude:
                miss = diag.misses.get(name)
                if miss is None:
                    miss = diag.misses[name] = self._near_miss(nodes[name], req, strategy, ctx)
                near.append(miss)
        return counts, tuple(near), fitting

    def _diagnosis(self, req: Request, strategy: Strategy, ctx: ScoreContext) -> "_Diagnosis":
        shape = (_static_signature(req), req.gpus, req.gpu_milli, req.cpu_milli, req.memory_mib)
        index = self.index
        log, base = index.touched, index.touched_base
        diag = self._diagnoses.get(shape)
        if diag is None or diag.seq < base:
            diag = _Diagnosis()
            for node in index.nodes.values():
                diag.add(node.name, *self._classify(node, req, strategy, ctx), bulk=True)
            diag.near.sort()
            self._diagnoses[shape] = diag
            if len(self._diagnoses) > _DIAGNOSIS_LIMIT:
                self._diagnoses.popitem(last=False)
        else:
            self._diagnoses.move_to_end(shape)
            nodes = index.nodes
            for name in set(log[diag.seq - base :]):
                diag.drop(name)
                node = nodes.get(name)
                if node is not None:
                    diag.add(name, *self._classify(node, req, strategy, ctx))
        diag.seq = base + len(log)
        return diag

    def _denial(self, req, strategy_name, counts: Counter, near: tuple[NearMiss, ...], prefix: str = "") -> Denial:
        by_reason = tuple(sorted(counts.items(), key=lambda kv: (-kv[1], kv[0].value)))
        parts = []
        for reason, n in by_reason:
            text = f"{n} node(s) {reason.value}"
            best = next((m for m in near if m.reasons and m.reasons[0] == reason), None)
            if best is not None:
                if reason == Reason.NOT_ENOUGH_GPUS:
                    text += f" (best: {best.node} has {best.free_gpus} free)"
                else:
                    text += f" (best: {best.node} {best.detail})"
            parts.append(text)
        if not self.index.nodes:
            parts.append("the ledger knows no nodes")
        message = prefix or f"no node fits {self._describe(req)} with strategy {strategy_name}"
        return Denial(
            id=req.id,
            message=f"{message}: {', '.join(parts)}" if parts else message,
            by_reason=by_reason,
            near_misses=near,
            strategy=strategy_name,
        )

    # ------------------------------------------------------------------------------------------ admission
    def reserve(self, request: Request, now: float) -> Placement | Denial:
        """Reserve for `request.id` (idempotent: a known id returns its placement)."""
        self._last_now = max(self._last_now, now)
        existing = self._reservations.get(request.id)
        if existing is not None:
            return existing.placement
        decision = self._decide(request, now)
        if isinstance(decision, Denial):
            return decision
        if isinstance(decision, _GroupPlan):
            return self._commit_group(decision, request, now)
        if isinstance(decision, _SlotClaim):
            return self._commit_claim(decision, request, now)
        placement = decision
        self._hold(
            Holding(
                placement.id,
                placement.node,
                placement.devices,
                placement.shares,
                placement.cpu_milli,
                placement.memory_mib,
            )
        )
        self._reservations[placement.id] = Reservation(placement, ReservationState.RESERVED, now)
        if placement.strategy == "round_robin":
            self._rr_cursor = placement.node
        return placement

    def explain(self, request: Request, with_scores: bool = True) -> Explanation:
        """The decision `reserve` would make now, with every node's score or reasons; reserves nothing.
        `with_scores=False` skips the per-node table (a dry run needs only the decision)."""
        existing = self._reservations.get(request.id)
        if existing is not None:
            result: Placement | Denial = existing.placement
        else:
            decision = self._decide(request, self._last_now if self._last_now > float("-inf") else 0.0)
            if isinstance(decision, _GroupPlan):
                result = self._group_placement(decision, request, 0, request.id, decision.deadline)
            elif isinstance(decision, _SlotClaim):
                result = self._claim_placement(decision, request)
            else:
                result = decision
        if not with_scores:
            return Explanation(result=result)
        try:
            strategy = get_strategy(request.strategy or self.config.default_strategy)
        except ValueError:
            return Explanation(result=result)
        ctx = self._context(request)
        scores = []
        for node in self.index.nodes.values():
            if not node.placeable:
                info = node.info
                reason = Reason.NOT_READY if (not info.ready or info.unschedulable) else Reason.NOT_GPU_SCHEDULABLE
                scores.append(NodeScore(node.name, None, (reason,)))
                continue
            reason, _ = self._static(node, request)
            if reason is not None:
                scores.append(NodeScore(node.name, None, (reason,)))
                continue
            fit, reasons = self._dynamic(node, request, strategy, ctx)
            if reasons:
                scores.append(NodeScore(node.name, None, tuple(reasons)))
            else:
                scores.append(NodeScore(node.name, strategy.score(node, request, fit, ctx)))
        scores.sort(key=lambda s: (s.score is None, -(s.score or 0.0), s.node))
        return Explanation(result=result, scores=tuple(scores))

    def _decide(self, req: Request, now: float):
        try:
            name = canonical_name(req.strategy or self.config.default_strategy)
            strategy = get_strategy(name)
        except ValueError as err:
            return Denial(id=req.id, message=str(err), strategy=str(req.strategy or ""))
        bad = _validate(req)
        if bad:
            return Denial(id=req.id, message=bad, strategy=name)
        ctx = self._context(req)
        if req.group is not None and req.group.size > 1:
            return self._decide_group(req, strategy, name, ctx, now)
        if req.pinned is not None:
            return self._decide_pinned(req, name, ctx)
        gate = strategy.admit(req, ctx)
        if gate is not None:
            return Denial(
                id=req.id,
                message=(
                    f"no node fits {self._describe(req)} with strategy {name}: {gate.value} "
                    f"(priority {req.priority} may not leave less than {self.config.priority_headroom:.0%} "
                    f"of the cluster's GPU capacity free; priority >= 1 may)"
                ),
                by_reason=((gate, len(self.index.nodes)),),
                strategy=name,
            )
        choice = self._select_soft_domain(req, strategy, ctx)
        if choice is None:
            counts, near, _ = self._diagnose(req, strategy, ctx)
            return self._denial(req, name, counts, near)
        return self._placement(req, choice, name)

    def _placement(self, req: Request, choice: _Choice, strategy_name: str, **extra) -> Placement:
        fit = choice.fit
        return Placement(
            id=req.id,
            node=choice.node.name,
            devices=fit.devices,
            shares=fit.shares,
            uuids=self._uuids(choice.node, [*fit.devices, *(s.device for s in fit.shares)]),
            cpu_milli=req.cpu_milli,
            memory_mib=req.memory_mib,
            strategy=strategy_name,
            score=float(choice.score),
            tolerated_taints=choice.taints,
            **extra,
        )

    def _decide_pinned(self, req: Request, strategy_name: str, ctx: ScoreContext) -> Placement | Denial:
        pin = req.pinned
        assert pin is not None

        def deny(reason: Reason, why: str) -> Denial:
            return Denial(
                id=req.id,
                message=f"explicit map (gpu-scheduling-map) {pin.node}:{list(pin.devices)} cannot be honoured: {why}",
                by_reason=((reason, 1),),
                strategy="explicit",
            )

        node = self.index.nodes.get(pin.node)
        if node is None:
            return deny(Reason.PINNED, f"node {pin.node} is unknown")
        if not pin.devices and req.needs_gpu:
            return deny(Reason.PINNED, "the map lists no devices")
        reason, taints = self._static(node, req)
        if reason is not None:
            return deny(reason, f"node {pin.node}: {reason.value}")
        if not node.placeable:
            return deny(Reason.NOT_READY, f"node {pin.node} is not ready, cordoned or not GPU-schedulable")
        for d in pin.devices:
            p = node.pos.get(d)
            if p is None:
                return deny(Reason.PINNED, f"device {d} does not exist on {pin.node} (it has {node.dev_index})")
            if not node.dev_healthy[p]:
                return deny(Reason.PINNED, f"device {d} on {pin.node} is unhealthy")
        if node.cpu_free < req.cpu_milli:
            return deny(Reason.NOT_ENOUGH_CPU, f"{node.cpu_free}m cpu free, {req.cpu_milli}m requested")
        if node.mem_free < req.memory_mib:
            return deny(Reason.NOT_ENOUGH_MEMORY, f"{node.mem_free} MiB free, {req.memory_mib} MiB requested")
        if req.is_shared:
            d = pin.devices[0]
            p = node.pos[d]
            if node.dev_owner[p] is not None or node.dev_free_milli[p] < req.gpu_milli:
                return deny(Reason.PINNED, f"device {d} is taken ({node.dev_free_milli[p]}m free)")
            if req.gpu_memory_mib and node.dev_mem_total[p] and node.dev_free_mem[p] < req.gpu_memory_mib:
                return deny(Reason.PINNED, f"device {d} has {node.dev_free_mem[p]} MiB free")
            if node.dev_nshares[p] == 0 and node.whole_free < 1:
                return deny(Reason.PINNED, f"{pin.node} has no GPU to spare (GPUs of unknown identity in use)")
            fit = Fit(shares=(DeviceShare(d, req.gpu_milli, req.gpu_memory_mib),))
        else:
            taken = [d for d in pin.devices if not node.is_fully_free(node.pos[d])]
            if taken:
                return deny(Reason.PINNED, f"device(s) {taken} on {pin.node} are taken")
            if node.whole_free < len(set(pin.devices)):
                return deny(
                    Reason.PINNED,
                    f"{pin.node} has {node.whole_free} GPU(s) to spare (GPUs of unknown identity in use)",
                )
            fit = Fit(devices=tuple(sorted(set(pin.devices))))
        return self._placement(req, _Choice(node, fit, 0.0, taints), "explicit")

    # ------------------------------------------------------------------------------------------ groups
    def _decide_group(self, req, strategy, name, ctx, now):
        group = self._groups.get(req.group.key)
        if group is not None:
            return self._decide_claim(req, group, strategy, name, ctx)
        spec = req.group
        per_pod = req.gpus
        cap_limit = spec.max_nodes_per_leaf or spec.size
        if spec.max_gpus_per_leaf and per_pod:
            cap_limit = min(cap_limit, spec.max_gpus_per_leaf // per_pod)
        if cap_limit <= 0:
            return Denial(
                id=req.id,
                message=(
                    f"group {spec.key}: max_gpus_per_leaf={spec.max_gpus_per_leaf} cannot hold even one pod "
                    f"of {per_pod} GPU(s)"
                ),
                by_reason=((Reason.LEAF_CONSTRAINT, len(self.index.nodes)),),
                strategy=name,
            )
        topo = self.topology()
        spread = name == "distributed"
        exact: dict[LeafKey, list[_Choice]] = {}

        def upper(leaf: LeafKey) -> int:
            b = self.index.leaves.get(leaf)
            if b is None:
                return 0
            n = sum(len(lst) for k, lst in b.by_free.items() if k >= per_pod) if per_pod else b.count
            return min(n, cap_limit)

        def exact_choices(leaf: LeafKey) -> list[_Choice]:
            got = exact.get(leaf)
            if got is None:
                got = []
                b = self.index.leaves.get(leaf)
                if b is not None:
                    for k, names in b.by_free.items():
                        if k < per_pod:
                            continue
                        for nm in names:
                            c = self._try(self.index.nodes[nm], req, strategy, ctx)
                            if c is not None:
                                got.append(c)
                got.sort(key=lambda c: (-c.score, c.node.name))
                exact[leaf] = got
            return got

        def attempt(leaves_allowed: set[LeafKey] | None):
            caps = {}
            for leaf in topo.order():
                if leaves_allowed is not None and leaf not in leaves_allowed:
                    continue
                caps[leaf] = min(len(exact[leaf]), cap_limit) if leaf in exact else upper(leaf)
            while True:
                plan = plan_leaves(topo, caps, spec.size, spread)
                if plan is None:
                    return None
                stale = [leaf for leaf, _ in plan if leaf not in exact]
                if not stale:
                    return plan
                for leaf in stale:
                    caps[leaf] = min(len(exact_choices(leaf)), cap_limit)

        domain = self._domain_leaves(req.preferred_domain)
        plan = attempt(set(domain)) if domain else None
        if plan is None:
            plan = attempt(None)
        if plan is None:
            counts, near, fitting = self._diagnose(req, strategy, ctx)
            if fitting:
                counts[Reason.LEAF_CONSTRAINT] += fitting
            limits = []
            if spec.max_nodes_per_leaf:
                limits.append(f"max {spec.max_nodes_per_leaf} node(s) per leaf")
            if spec.max_gpus_per_leaf:
                limits.append(f"max {spec.max_gpus_per_leaf} GPU(s) per leaf")
            prefix = (
                f"no placement for group {spec.key}: {spec.size} pods x {self._describe(req)}, one pod per node"
                f"{' (' + ', '.join(limits) + ')' if limits else ''}, with strategy {name}; "
                f"{fitting} node(s) could take one pod"
            )
            return self._denial(req, name, counts, near, prefix=prefix)
        slots: list[tuple[int, _Choice]] = []
        for leaf, n in plan:
            for choice in exact[leaf][:n]:
                slots.append((len(slots), choice))
        return _GroupPlan(spec.key, slots, name, now + self.config.reservation_ttl_s)

    def _group_placement(self, gp: "_GroupPlan", req: Request, slot: int, pid: str, deadline: float) -> Placement:
        plan = tuple(
            GroupSlot(
                i,
                c.node.name,
                c.fit.devices,
                self._uuids(c.node, [*c.fit.devices, *(s.device for s in c.fit.shares)]),
                c.fit.shares,
            )
            for i, c in gp.slots
        )
        choice = gp.slots[slot][1]
        p = self._placement(req, choice, gp.strategy, group=gp.key, slot=slot, group_plan=plan, group_deadline=deadline)
        return p

    def _commit_group(self, gp: "_GroupPlan", req: Request, now: float) -> Placement:
        first = self._group_placement(gp, req, 0, req.id, gp.deadline)
        group = GroupState(
            key=gp.key,
            slots={s.slot: s for s in first.group_plan},
            claims={},
            deadline=gp.deadline,
            cpu_milli=req.cpu_milli,
            memory_mib=req.memory_mib,
            strategy=gp.strategy,
        )
        self._groups[gp.key] = group
        group.slot_taints = {i: c.taints for i, c in gp.slots}
        for s in first.group_plan:
            hid = req.id if s.slot == 0 else slot_hid(gp.key, s.slot)
            group.claims[s.slot] = req.id if s.slot == 0 else None
            self._slot_of[hid] = (gp.key, s.slot)
            self._hold(Holding(hid, s.node, s.devices, s.shares, req.cpu_milli, req.memory_mib))
        self._reservations[req.id] = Reservation(first, ReservationState.RESERVED, now)
        return first

    def _taints_for(self, group: GroupState, slot: int) -> tuple[Taint, ...]:
        if slot in group.slot_taints:
            return group.slot_taints[slot]
        node = self.index.nodes.get(group.slots[slot].node)
        if node is None:
            return ()
        keys = self.config.tolerated_gpu_taint_keys
        return tuple(t for t in node.info.taints if t.effect in _HARD_EFFECTS and t.key in keys)

    def _decide_claim(self, req, group: GroupState, strategy, name, ctx):
        free = sorted(s for s, who in group.claims.items() if who is None)
        if free:
            return _SlotClaim(group.key, free[0], None)
        size = len(group.slots) if group.slots else req.group.size
        live = len([s for s in group.claims if group.claims[s] is not None])
        if live >= max(size, req.group.size):
            return Denial(
                id=req.id,
                message=(
                    f"group {group.key} already has {live} pod(s) placed in {live} slot(s); a new pod of the group "
                    "gets a slot when one of them is released"
                ),
                by_reason=((Reason.LEAF_CONSTRAINT, 1),),
                strategy=name,
            )
        # re-place one missing slot near the group: its leaves first, one pod per node, leaf limits kept
        used_nodes = {s.node for s in group.slots.values()}
        leaf_count: Counter[LeafKey] = Counter()
        for s in group.slots.values():
            n = self.index.nodes.get(s.node)
            if n is not None:
                leaf_count[n.leaf_key] += 1
        spec = req.group
        blocked = set()
        for leaf, c in leaf_count.items():
            if spec.max_nodes_per_leaf and c >= spec.max_nodes_per_leaf:
                blocked.add(leaf)
            if spec.max_gpus_per_leaf and (c + 1) * req.gpus > spec.max_gpus_per_leaf:
                blocked.add(leaf)
        exclude = used_nodes | {n.name for n in self.index.nodes.values() if n.leaf_key in blocked}
        group_leaves = sorted(set(leaf_count) - blocked)
        choice = self._select(req, strategy, ctx, group_leaves, exclude) if group_leaves else None
        if choice is None:
            choice = self._select(req, strategy, ctx, None, exclude)
        if choice is None:
            counts, near, _ = self._diagnose(req, strategy, ctx, exclude)
            return self._denial(req, name, counts, near, prefix=f"no node for a new pod of group {group.key}")
        slot = next(i for i in range(len(group.slots) + 1) if i not in group.slots)
        return _SlotClaim(group.key, slot, choice)

    def _claim_placement(self, claim: "_SlotClaim", req: Request) -> Placement:
        group = self._groups[claim.group]
        if claim.new is not None:
            c = claim.new
            slot = GroupSlot(
                claim.slot,
                c.node.name,
                c.fit.devices,
                self._uuids(c.node, [*c.fit.devices, *(s.device for s in c.fit.shares)]),
                c.fit.shares,
            )
            plan = tuple(sorted([*group.slots.values(), slot], key=lambda s: s.slot))
            taints = c.taints
        else:
            slot = group.slots[claim.slot]
            plan = group.plan()
            taints = self._taints_for(group, claim.slot)
        return Placement(
            id=req.id,
            node=slot.node,
            devices=slot.devices,
            shares=slot.shares,
            uuids=slot.uuids,
            cpu_milli=group.cpu_milli,
            memory_mib=group.memory_mib,
            group=group.key,
            slot=claim.slot,
            strategy=group.strategy,
            tolerated_taints=taints,
            group_plan=plan,
            group_deadline=group.deadline,
        )

    def _commit_claim(self, claim: "_SlotClaim", req: Request, now: float) -> Placement:
        group = self._groups[claim.group]
        placement = self._claim_placement(claim, req)
        if claim.new is None:
            self._unhold(slot_hid(group.key, claim.slot))
            self._slot_of.pop(slot_hid(group.key, claim.slot), None)
        else:
            group.slots[claim.slot] = placement.group_plan[[s.slot for s in placement.group_plan].index(claim.slot)]
        group.claims[claim.slot] = req.id
        self._slot_of[req.id] = (group.key, claim.slot)
        self._hold(
            Holding(req.id, placement.node, placement.devices, placement.shares, group.cpu_milli, group.memory_mib)
        )
        self._reservations[req.id] = Reservation(placement, ReservationState.RESERVED, now)
        return placement

    def _drop_slot(self, group: GroupState, slot: int) -> None:
        group.slots.pop(slot, None)
        group.claims.pop(slot, None)
        if not group.slots:
            del self._groups[group.key]

    # ------------------------------------------------------------------------------------------ lifecycle
    def get(self, id: str) -> Placement | None:
        res = self._reservations.get(id)
        return None if res is None else res.placement

    def state_of(self, id: str) -> ReservationState | None:
        res = self._reservations.get(id)
        return None if res is None else res.state

    def confirm(self, id: str, now: float) -> bool:
        """A stored pod carrying `id` was seen: the reservation no longer expires."""
        self._last_now = max(self._last_now, now)
        res = self._reservations.get(id)
        if res is None:
            return False
        res.state = ReservationState.CONFIRMED
        return True

    def release(self, id: str) -> bool:
        """Free what `id` holds (a reservation, an unclaimed group slot id, or a counted pod). Idempotent.

        A group pod's slot returns to the group, unclaimed, while the group's deadline has not passed and
        another pod of the group still holds a slot (so a replacement pod finds it); otherwise its devices
        are freed. When the last pod of a group goes, its unclaimed slots go too: only pods carry the plan, so
        this is what a rebuild would see."""
        res = self._reservations.pop(id, None)
        slot = self._slot_of.pop(id, None)
        held = self._unhold(id)
        if slot is not None:
            key, n = slot
            group = self._groups.get(key)
            if group is not None:
                others = any(who is not None and s != n for s, who in group.claims.items())
                if res is not None and others and group.deadline > self._last_now and n in group.slots:
                    s = group.slots[n]
                    group.claims[n] = None
                    hid = slot_hid(key, n)
                    self._slot_of[hid] = (key, n)
                    self._hold(Holding(hid, s.node, s.devices, s.shares, group.cpu_milli, group.memory_mib))
                else:
                    self._drop_slot(group, n)
                    if key in self._groups and not any(who is not None for who in group.claims.values()):
                        for s in sorted(group.slots):
                            self.release(slot_hid(key, s))
        return res is not None or held is not None or slot is not None

    def expiry_candidates(self, now: float) -> list[str]:
        """Ids of unconfirmed reservations older than the TTL, and unclaimed group slots past the deadline."""
        ttl = self.config.reservation_ttl_s
        out = [
            rid
            for rid, res in self._reservations.items()
            if res.state == ReservationState.RESERVED and res.created + ttl <= now
        ]
        for group in self._groups.values():
            if group.deadline <= now:
                out += [slot_hid(group.key, s) for s, who in group.claims.items() if who is None]
        return sorted(out)

    def expire(self, now: float) -> list[str]:
        self._last_now = max(self._last_now, now)
        ids = self.expiry_candidates(now)
        for rid in ids:
            self.release(rid)
        # claimed slots released above may have returned to their group past its deadline
        for rid in self.expiry_candidates(now):
            if rid not in self._reservations:
                self.release(rid)
        return ids

    # ------------------------------------------------------------------------------------------ cluster objects
    def apply_object(self, obj: dict, now: float) -> None:
        """An ADDED/MODIFIED Node or Pod (or a List of them)."""
        self._last_now = max(self._last_now, now)
        for item in kube.iter_objects(obj):
            self._apply_one(item, now)

    def _apply_one(self, item: dict, now: float) -> None:
        try:
            kind = kube.kind_of(item)
            if kind == "Pod":
                self._apply_pod(item, now)
            elif kind == "Node":
                problems: list[str] = []
                info = kube.node_from_object(item, self.config, problems)
                if not info.name:
                    raise ValueError("metadata.name is missing")
                self.upsert_node(info)
                self.problems.extend(problems)
        except (TypeError, AttributeError, ValueError, KeyError, IndexError) as err:
            # one malformed object must not stop the ledger from following the cluster
            self.problems.append(f"ignored a malformed {type(item).__name__} object: {type(err).__name__}: {err}")

    def delete_object(self, obj: dict) -> None:
        for item in kube.iter_objects(obj):
            try:
                kind = kube.kind_of(item)
                if kind == "Node":
                    self.remove_node(str((item.get("metadata") or {}).get("name", "")))
                elif kind == "Pod":
                    self._forget_pod(kube.pod_key(item))
            except (TypeError, AttributeError, ValueError, KeyError, IndexError) as err:
                self.problems.append(f"ignored a malformed deleted object: {type(err).__name__}: {err}")

    def _forget_pod(self, key: str) -> None:
        hid = self._pods.pop(key, None)
        if hid is not None:
            self.release(hid)

    def _apply_pod(self, obj: dict, now: float) -> None:
        problems: list[str] = []
        usage = kube.pod_usage(obj, self.config.placement_key, problems, lazy=True)
        if problems:
            self.problems.extend(problems)
        prev = self._pods.get(usage.key)
        if usage.terminal:
            self._forget_pod(usage.key)
            return
        if usage.placement is not None:
            pid = usage.placement.id
            if prev is not None and prev != pid:
                self._forget_pod(usage.key)
            self._pods[usage.key] = pid
            if pid in self._reservations:
                self.confirm(pid, now)
                return
            self._adopt(usage, now)
            return
        hid = "pod:" + usage.key
        if not usage.node or not (usage.cpu_milli or usage.memory_mib or usage.gpus):
            if prev is not None:
                self._forget_pod(usage.key)
            return
        h = Holding(hid, usage.node, cpu_milli=usage.cpu_milli, memory_mib=usage.memory_mib, unknown_gpus=usage.gpus)
        if prev == hid and self._holdings.get(hid) == h:
            return
        if prev is not None:
            self._forget_pod(usage.key)
        self._pods[usage.key] = hid
        self._hold(h)

    def _adopt(self, usage: kube.PodUsage, now: float) -> None:
        """Take over a placement found on a pod (rebuild, or a pod whose reservation is gone)."""
        p = usage.placement
        assert p is not None
        if p.group is not None and p.slot is not None:
            group = self._groups.get(p.group)
            if group is None:
                group = self._restore_group(p, now)
            who = group.claims.get(p.slot)
            if who is not None and who != p.id:
                self._count_instead(usage, p)
                return
            if p.slot in group.slots and who is None and slot_hid(p.group, p.slot) in self._holdings:
                self._unhold(slot_hid(p.group, p.slot))
                self._slot_of.pop(slot_hid(p.group, p.slot), None)
            if not self._make_room(p):
                self._count_instead(usage, p)
                if p.slot in group.slots and group.claims.get(p.slot) is None:
                    self._drop_slot(group, p.slot)
                return
            group.slots[p.slot] = GroupSlot(p.slot, p.node, p.devices, p.uuids, p.shares)
            group.claims[p.slot] = p.id
            self._slot_of[p.id] = (p.group, p.slot)
        elif not self._make_room(p):
            self._count_instead(usage, p)
            return
        self._hold(Holding(p.id, p.node, p.devices, p.shares, p.cpu_milli, p.memory_mib))
        self._reservations[p.id] = Reservation(p, ReservationState.CONFIRMED, now)

    def _restore_group(self, p: Placement, now: float) -> GroupState:
        deadline = p.group_deadline if p.group_deadline is not None else now
        group = GroupState(
            key=p.group or "",
            slots={},
            claims={},
            deadline=deadline,
            cpu_milli=p.cpu_milli,
            memory_mib=p.memory_mib,
            strategy=p.strategy,
        )
        self._groups[group.key] = group
        if deadline > now:
            for s in p.group_plan:
                if s.slot == p.slot:
                    continue
                node = self.index.nodes.get(s.node)
                if node is not None and node.conflicts(s.devices, s.shares):
                    continue
                group.slots[s.slot] = s
                group.claims[s.slot] = None
                hid = slot_hid(group.key, s.slot)
                self._slot_of[hid] = (group.key, s.slot)
                self._hold(Holding(hid, s.node, s.devices, s.shares, p.cpu_milli, p.memory_mib))
        return group

    def _make_room(self, p: Placement) -> bool:
        """Whether a pod's placement can be held: unconfirmed holders in its way give way to the pod."""
        node = self.index.nodes.get(p.node)
        if node is None:
            return True
        blockers = node.conflicts(p.devices, p.shares)
        if not blockers:
            return True
        for hid in blockers:
            res = self._reservations.get(hid)
            unclaimed = hid in self._slot_of and hid not in self._reservations
            if not unclaimed and (res is None or res.state != ReservationState.RESERVED):
                return False
        for hid in sorted(blockers):
            self.release(hid)
        # a released claimed slot may have returned to its group, unclaimed, on the same devices
        for hid in sorted(node.conflicts(p.devices, p.shares)):
            if hid in self._slot_of and hid not in self._reservations:
                self.release(hid)
        return not node.conflicts(p.devices, p.shares)

    def _count_instead(self, usage: kube.PodUsage, p: Placement) -> None:
        """A placement that collides with a confirmed one: count the pod as GPUs of unknown identity."""
        self.problems.append(
            f"pod {usage.key}: placement {p.id} on {p.node} collides with another pod; counted as "
            f"{len(p.devices)} GPU(s) of unknown identity"
        )
        hid = "pod:" + usage.key
        self._pods[usage.key] = hid
        self._hold(
            Holding(
                hid,
                p.node,
                cpu_milli=p.cpu_milli,
                memory_mib=p.memory_mib,
                unknown_gpus=len(p.devices) or (1 if p.shares else 0),
            )
        )

    @classmethod
    def rebuild(cls, objects: Iterable[dict], config: LedgerConfig | None = None, now: float = 0.0) -> "Ledger":
        """A ledger holding exactly what the given nodes and pods say is held."""
        ledger = cls(config)
        ledger._last_now = now
        # A rebuild allocates ~10 objects per pod and frees none: the cyclic collector would rescan the growing
        # heap over and over (3x slower at 100k pods), so it is paused for the bulk load.
        was_enabled = gc.isenabled()
        gc.disable()
        try:
            # streamed: what a pod holds on a node not seen yet is applied when the node arrives
            for obj in kube.iter_objects(objects):
                ledger._apply_one(obj, now)
        finally:
            if was_enabled:
                gc.enable()
        return ledger

    # ------------------------------------------------------------------------------------------ views
    def snapshot(self) -> dict:
        """Canonical state (no timestamps, no rotation cursor): equal for a live ledger and its rebuild."""
        nodes = {}
        for name in sorted(self.index.nodes):
            n = self.index.nodes[name]
            nodes[name] = {
                "cpu_free": n.cpu_free,
                "mem_free": n.mem_free,
                "unknown_gpus": n.unknown_gpus,
                "devices": [
                    [
                        n.dev_index[p],
                        n.dev_free_milli[p],
                        n.dev_free_mem[p],
                        n.dev_owner[p],
                        sorted([hid, s.milli, s.memory_mib] for hid, s in (n.dev_shares[p] or {}).items()),
                    ]
                    for p in range(len(n.dev_index))
                ],
            }
        reservations = {
            rid: [res.state.value, kube.placement_to_dict(res.placement)]
            for rid, res in sorted(self._reservations.items())
        }
        groups = {
            key: {
                "deadline": g.deadline,
                "slots": {
                    s: [g.slots[s].node, list(g.slots[s].devices), [[x.device, x.milli] for x in g.slots[s].shares], g.claims.get(s)]
                    for s in sorted(g.slots)
                },
            }
            for key, g in sorted(self._groups.items())
        }
        holdings = {
            hid: [h.node, list(h.devices), [[s.device, s.milli, s.memory_mib] for s in h.shares], h.cpu_milli, h.memory_mib, h.unknown_gpus]
            for hid, h in sorted(self._holdings.items())
        }
        return {"nodes": nodes, "reservations": reservations, "groups": groups, "holdings": holdings}

    def reservations(self) -> dict[str, Reservation]:
        return dict(self._reservations)

    def groups(self) -> dict[str, GroupState]:
        return dict(self._groups)

    def stats(self) -> LedgerStats:
        leaves: dict[LeafKey, list[int]] = {}
        gpus_total = gpus_healthy = placeable = 0
        for n in self.index.nodes.values():
            gpus_total += len(n.dev_index)
            healthy = sum(n.dev_healthy)
            gpus_healthy += healthy
            if not n.placeable:
                continue
            placeable += 1
            acc = leaves.setdefault(n.leaf_key, [0, 0, 0, 0, 0])
            acc[0] += 1
            acc[1] += healthy
            acc[2] += n.total_milli
            acc[3] += n.free_milli
            acc[4] += n.whole_free
        leaf_stats = []
        spine_acc: dict[str, list[int]] = {}
        for (spine, leaf), (cnt, gpus, tot, free, whole) in sorted(leaves.items()):
            leaf_stats.append(DomainStats(spine, leaf, cnt, gpus, tot, free, whole))
            acc = spine_acc.setdefault(spine, [0, 0, 0, 0, 0])
            for i, v in enumerate((cnt, gpus, tot, free, whole)):
                acc[i] += v
        spine_stats = tuple(DomainStats(s, "", *v) for s, v in sorted(spine_acc.items()))
        milli_total = sum(s.milli_total for s in leaf_stats)
        milli_free = sum(s.milli_free for s in leaf_stats)
        pending = sum(1 for r in self._reservations.values() if r.state == ReservationState.RESERVED)
        return LedgerStats(
            nodes=len(self.index.nodes),
            placeable_nodes=placeable,
            gpus_total=gpus_total,
            gpus_healthy=gpus_healthy,
            milli_total=milli_total,
            milli_allocated=milli_total - milli_free,
            whole_free=sum(s.whole_free for s in leaf_stats),
            reservations_pending=pending,
            reservations_confirmed=len(self._reservations) - pending,
            groups=len(self._groups),
            unclaimed_slots=sum(1 for g in self._groups.values() for who in g.claims.values() if who is None),
            leaves=tuple(leaf_stats),
            spines=spine_stats,
        )


class _Diagnosis:
    """Every node's denial classification for one request shape: counts per reason, the nodes that fit, and
    the near-miss keys in order; `seq` is the position in `ClusterIndex.touched` it is current up to."""

    __slots__ = ("seq", "first", "counts", "fitting", "near", "misses", "_keys")

    def __init__(self) -> None:
        self.seq = 0
        self.first: dict[str, Reason | None] = {}  # node -> reason counted (None = fits)
        self.counts: dict[Reason, int] = {}
        self.fitting = 0
        self.near: list[tuple] = []  # sorted near-miss keys (closest first), the node name last
        self.misses: dict[str, NearMiss] = {}  # near misses built so far, valid until their node is touched
        self._keys: dict[str, tuple] = {}  # node -> its key in `near`

    def add(self, name: str, reason: Reason | None, key: tuple | None, bulk: bool = False) -> None:
        """Count a node in; `bulk` appends its key unsorted (the caller sorts `near` once at the end)."""
        self.first[name] = reason
        if reason is None:
            self.fitting += 1
        else:
            self.counts[reason] = self.counts.get(reason, 0) + 1
        if key is not None:
            self._keys[name] = key
            if bulk:
                self.near.append(key)
            else:
                insort(self.near, key)

    def drop(self, name: str) -> None:
        if name not in self.first:
            return
        reason = self.first.pop(name)
        if reason is None:
            self.fitting -= 1
        else:
            left = self.counts[reason] - 1
            if left:
                self.counts[reason] = left
            else:
                del self.counts[reason]
        self.misses.pop(name, None)
        key = self._keys.pop(name, None)
        if key is not None:
            del self.near[bisect_left(self.near, key)]


def _max_share(node: NodeState) -> int:
    """The largest free milli-GPU on a device without an exclusive holder."""
    owner, free = node.dev_owner, node.dev_free_milli
    return max((free[p] for p in range(len(owner)) if owner[p] is None), default=0)


@dataclass
class _GroupPlan:
    key: str
    slots: list[tuple[int, _Choice]]
    strategy: str
    deadline: float


@dataclass
class _SlotClaim:
    group: str
    slot: int
    new: _Choice | None  # None = an unclaimed slot of the plan; else a new slot placed now


def _static_signature(req: Request) -> tuple:
    """What the static filters read from a request: requests equal here get the same static verdicts."""
    return (
        req.product,
        req.gpu_memory_mib,
        req.gpus > 0,
        req.needs_gpu,
        req.node_selector,
        req.affinity_terms,
        req.tolerations,
    )


def _requirement_matches(req, labels: dict[str, str]) -> bool:
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


def _validate(req: Request) -> str:
    """A message naming the bad field and what is accepted, or ''."""
    if req.gpus < 0:
        return f"request {req.id}: gpus={req.gpus}; accepted: an integer >= 0"
    if req.gpus > 0 and req.gpu_milli:
        return (
            f"request {req.id}: gpus={req.gpus} with gpu_milli={req.gpu_milli}; accepted: whole GPUs or a "
            "share of one GPU, not both"
        )
    if not 0 <= req.gpu_milli <= MILLI_PER_GPU:
        return f"request {req.id}: gpu_milli={req.gpu_milli}; accepted: 0..{MILLI_PER_GPU}"
    if req.gpu_memory_mib < 0 or req.cpu_milli < 0 or req.memory_mib < 0:
        return f"request {req.id}: negative resource request; accepted: values >= 0"
    if req.group is not None and req.group.size < 1:
        return f"request {req.id}: group {req.group.key} size={req.group.size}; accepted: >= 1"
    return ""
