"""fgd: the node and device where the node's expected fragmentation grows least (Weng et al., ATC'23); the
math is in `fragmentation`, this adds the per-ledger memo and the candidate walk (a simulation's hot loop).
The fast path must never decide differently from scoring every node (test_fgd checks it against a plain scan).
"""

from __future__ import annotations

import weakref

from gpuledger.core.model import MILLI_PER_GPU, DeviceShare, Request
from gpuledger.core.plugins.plugin import Fit, ScoreContext, Strategy, choose_whole_devices, device_ok
from gpuledger.strategies.fgd_classes import StateClasses
from gpuledger.strategies.fragmentation import (
    WORKLOAD_KEY,
    FragmentationMeter,
    TargetWorkload,
    WorkloadTracker,
)
from gpuledger.strategies.walks import bucket_walk


class _NodeCache:
    """Per-ledger memo. `nodes`: node name -> (NodeState, state signature, {request shape: (increase, Fit)}),
    valid while the node's state is unchanged; `shared`: (request shape, node kind, state) -> the same, so
    that identical nodes in identical states are evaluated once."""

    __slots__ = ("meter", "nodes", "shared", "kinds")

    def __init__(self, meter: FragmentationMeter):
        self.meter = meter
        self.nodes: dict[str, tuple] = {}
        self.shared: dict[tuple, object] = {}
        self.kinds: dict[int, tuple] = {}

    def kind(self, node) -> tuple:
        """What, besides free state, decides a node's evaluation: model, device indices, health, products."""
        held = self.kinds.get(id(node.info))
        if held is None or held[0] is not node.info:
            info = node.info
            kind = (
                info.product,
                tuple(node.dev_index),
                tuple(node.dev_healthy),
                tuple(d.product for d in info.devices),
            )
            held = self.kinds[id(info)] = (info, kind)
        return held[1]


class FragmentationGradientDescent(Strategy):
    """FGD: the node and device whose placement raises the node's expected fragmentation least.

    Score = -(fragmentation after - fragmentation before), ties to the lowest node name. Provides a candidate
    walk that evaluates every node once per request from a per-node memo (a node's entry changes only when
    its free state does), so the ledger does not re-filter every node.

    The target workload comes from `ctx.extra[WORKLOAD_KEY]` (a TargetWorkload, e.g. the simulator's trace)
    or, when absent, is learnt from the requests this ledger has seen.
    """

    name = "fgd"
    # a node is refused exactly when the default device choice refuses it (only *which* devices differs), so
    # the ledger's denial diagnosis may classify nodes with the default choice, kept current per shape
    refuses_as_default = True

    def __init__(self) -> None:
        self._meters: dict[int, tuple[TargetWorkload, FragmentationMeter]] = {}
        self._trackers: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._caches: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._last_ctx: ScoreContext | None = None
        self._last_cache: _NodeCache | None = None
        self._classes: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
        self._kinds: dict[int, tuple] = {}
        self._last_evaluation: tuple | None = None
        self._last_classes: StateClasses | None = None
        self._last_offsets: tuple | None = None  # (request, ctx, change-log position, offsets per model)

    # ------------------------------------------------------------------ inputs
    def meter(self, ctx: ScoreContext) -> FragmentationMeter:
        workload = ctx.extra.get(WORKLOAD_KEY) if ctx.extra else None
        if isinstance(workload, TargetWorkload):
            held = self._meters.get(id(workload))
            if held is None or held[0] is not workload:
                if len(self._meters) > 16:
                    self._meters.clear()
                held = self._meters[id(workload)] = (workload, FragmentationMeter(workload))
            return held[1]
        tracker = self._trackers.get(ctx.index)
        if tracker is None:
            tracker = self._trackers[ctx.index] = WorkloadTracker()
        return tracker.meter()

    def admit(self, request, ctx):
        if not (ctx.extra and isinstance(ctx.extra.get(WORKLOAD_KEY), TargetWorkload)):
            tracker = self._trackers.get(ctx.index)
            if tracker is None:
                tracker = self._trackers[ctx.index] = WorkloadTracker()
            tracker.observe(request)
        return None

    def _cache(self, ctx: ScoreContext) -> _NodeCache:
        """The per-ledger memo for this request's meter; node classes kept current."""
        if (
            ctx is self._last_ctx and self._last_cache is not None
        ):  # the ledger asks once per node per request
            return self._last_cache
        meter = self.meter(ctx)
        classes = self._classes.get(ctx.index)
        if classes is None:
            classes = self._classes[ctx.index] = StateClasses(ctx.index)
        classes.sync(self._class_key)
        cache = self._caches.get(ctx.index)
        if cache is None or cache.meter is not meter:
            cache = self._caches[ctx.index] = _NodeCache(meter)
        classes.use(cache)
        self._last_ctx, self._last_cache, self._last_classes = ctx, cache, classes
        return cache

    def model_offsets(
        self, request: Request, meter: FragmentationMeter, classes: StateClasses
    ) -> dict[str, float]:
        """Per GPU model, a cost added to every node of that model for this request, outside the memo (it may
        move with every placement, e.g. with the free capacity per model); fgd adds none."""
        return {}

    uses_offsets = False  # whether `model_offsets` adds anything (fgd_host)

    def _offsets(self, request: Request, ctx: ScoreContext) -> dict[str, float]:
        """`model_offsets` for this request, computed once per request and cluster state."""
        if not self.uses_offsets:
            return _NO_OFFSETS
        index = ctx.index
        moved = index.touched_base + len(index.touched)
        last = self._last_offsets
        if last is not None and last[0] is request and last[1] is ctx and last[2] == moved:
            return last[3]
        cache = self._cache(ctx)  # keeps the classes (and their free capacity per model) current
        assert self._last_classes is not None
        offsets = self.model_offsets(request, cache.meter, self._last_classes)
        self._last_offsets = (request, ctx, moved, offsets)
        return offsets

    # ------------------------------------------------------------------ evaluation
    def extra_cost(self, meter: FragmentationMeter, node, request: Request, taken_milli: int) -> float:
        """Added to the fragmentation increase; FGD itself adds nothing."""
        return 0.0

    uses_memory = False  # whether free host memory enters the evaluation (beyond the fit check)

    def _signature(self, node) -> tuple:
        """The node's free state as far as an evaluation can tell (`fully_free` catches a device held only by
        memory shares, whose free milli still reads 1000)."""
        if self.uses_memory:
            return (
                node.cpu_free,
                node.mem_free,
                node.unknown_gpus,
                node.fully_free,
                tuple(node.dev_free_milli),
            )
        return node.cpu_free, node.unknown_gpus, node.fully_free, tuple(node.dev_free_milli)

    def _evaluate(self, node, request: Request, cache: _NodeCache):
        """(increase, Fit) for the request on this node, or None when its GPUs cannot hold it."""
        if request.gpu_memory_mib:  # per-device memory makes the device choice state-specific: no memo
            return self._compute(node, request, cache.meter)
        signature = self._signature(node)
        entry = cache.nodes.get(node.name)
        if entry is None or entry[0] is not node or entry[1] != signature:
            entry = cache.nodes[node.name] = (node, signature, {})
        key = (request.cpu_milli, request.memory_mib, request.gpus, request.gpu_milli, request.product)
        results = entry[2]
        if key in results:
            return results[key]
        result = results[key] = self._shared(node, request, cache, key, signature)
        return result

    def _shared(self, node, request: Request, cache: _NodeCache, key: tuple, signature: tuple):
        if node.fully_free != sum(1 for free in node.dev_free_milli if free >= MILLI_PER_GPU):
            return self._compute(node, request, cache.meter)  # which device is memory-shared: not shareable
        shared_key = (key, cache.kind(node), signature)
        if shared_key in cache.shared:
            return cache.shared[shared_key]
        if len(cache.shared) > 200_000:
            cache.shared.clear()
        result = cache.shared[shared_key] = self._compute(node, request, cache.meter)
        return result

    def _compute(self, node, request: Request, meter: FragmentationMeter):
        free = _free_vector(node)
        product = node.info.product or next((d.product for d in node.info.devices if d.product), "")
        before = meter.fragmentation(node.cpu_free, free, product)
        cpu_after = node.cpu_free - request.cpu_milli
        if request.gpus > 0:
            devices = choose_whole_devices(node, request)
            if devices is None:
                return None
            emptied = list(free)
            for index in devices:
                emptied[node.pos[index]] = 0
            after: list[int] | tuple[int, ...] = emptied
            fit = Fit(devices=devices)
            taken = request.gpus * MILLI_PER_GPU
        elif request.is_shared:
            best = None
            milli, memory = request.gpu_milli, request.gpu_memory_mib
            for p, free_milli in enumerate(free):
                if free_milli < milli or node.dev_owner[p] is not None:
                    continue
                if memory and node.dev_mem_total[p] and node.dev_free_mem[p] < memory:
                    continue
                if node.dev_nshares[p] == 0 and node.whole_free <= 0:
                    continue  # opening an idle device needs a whole GPU to spare (unknown-identity GPUs)
                if not device_ok(node, p, request):
                    continue
                trial = list(free)
                trial[p] = free_milli - milli
                increase = round(meter.fragmentation(cpu_after, trial, product) - before, 6)
                candidate = (increase, free_milli, p, trial)
                if best is None or candidate[:3] < best[:3]:
                    best = candidate
            if best is None:
                return None
            after = best[3]
            fit = Fit(shares=(DeviceShare(device=node.dev_index[best[2]], milli=milli, memory_mib=memory),))
            taken = milli
        else:
            after, fit, taken = free, Fit(), 0
        increase = meter.fragmentation(cpu_after, after, product) - before
        # rounded so that equal increases compare equal whatever the order of float sums (ties go by name)
        return round(increase + self.extra_cost(meter, node, request, taken), 6), fit

    # ------------------------------------------------------------------ the Strategy interface
    def _evaluate_for(self, node, request, ctx):
        """`_evaluate`, where the ledger's second ask for a node (devices, then score, nothing changed in
        between: the index's change log has not moved and the node's free state is the same) is answered
        from the first. The free state is compared too: a gang's successive probes hold devices on the node
        itself (`NodeState.apply`), which the index's change log does not record."""
        index = ctx.index
        moved = index.touched_base + len(index.touched)
        last = self._last_evaluation
        if (
            last is not None
            and last[0] is node
            and last[1] is request
            and last[2] is ctx
            and last[3] == moved
            and last[5] == (node.cpu_free, node.mem_free, node.dev_free_milli)
        ):
            return last[4]
        result = self._evaluate(node, request, self._cache(ctx))
        self._last_evaluation = (node, request, ctx, moved, result, _free_state(node))
        return result

    def choose_devices(self, node, request, ctx):
        result = self._evaluate_for(node, request, ctx)
        return None if result is None else result[1]

    def score(self, node, request, fit, ctx):
        result = self._evaluate_for(node, request, ctx)
        if result is None:
            return 0.0
        offsets = self._offsets(request, ctx)
        if offsets:
            return -_offset(result[0], offsets, node)
        return -result[0]

    def candidates(self, request, ctx, leaves):
        """Every node that could hold the request, by fragmentation increase then name (the ledger's order).

        The hot loop of a simulation and of admission: nodes in the same class (model, devices, free state)
        score alike, so one evaluation per class (memoised while the workload stays) and a lazy merge of the
        classes' name lists give the exact order of scoring every node. Topology-restricted walks and
        per-device memory asks take the per-node scan (`scan_candidates`).
        """
        if leaves is not None or request.gpu_memory_mib:
            return self.scan_candidates(request, ctx, leaves)
        cache = self._cache(ctx)
        meter, compute, classes = cache.meter, self._compute, self._last_classes
        assert classes is not None  # set by _cache just above
        cpu, memory, gpus, milli = request.cpu_milli, request.memory_mib, request.gpus, request.gpu_milli

        def fits(node) -> bool:
            return (
                node.cpu_free >= cpu
                and node.mem_free >= memory
                and node.whole_free >= gpus
                and (not milli or node.free_milli >= milli)
            )

        key = (cpu, memory, gpus, milli, request.product)
        ranked = classes.ranked(fits, lambda node: compute(node, request, meter), key)
        offsets = self._offsets(request, ctx)
        if offsets and ranked:  # every node of a class has the same model: one offset per class
            nodes = ctx.index.nodes
            ranked = [(_offset(r[0], offsets, nodes[r[1]]), r[1], r[2], r[3]) for r in ranked]
            ranked.sort(key=_rank_key)
        return self._hinted(classes.walk(ranked), request, ctx)

    def _hinted(self, walk, request, ctx):
        """The walk's nodes, each leaving its class's result for the ledger's asks that follow (the Fit is
        the same on every node of a class: same devices, same free state)."""
        index = ctx.index
        moved = index.touched_base + len(index.touched)
        for node, result in walk:
            self._last_evaluation = (node, request, ctx, moved, result, _free_state(node))
            yield node

    def _class_key(self, node) -> tuple | None:
        """What decides every evaluation of this node: its kind and free state; None = not placeable.
        A node whose memory-only shares make its free milli ambiguous (`_shared`) is a class of its own."""
        if not node.placeable:
            return None
        free = tuple(node.dev_free_milli)
        state = (node.cpu_free, node.mem_free, node.unknown_gpus, node.fully_free, free)
        if node.fully_free != free.count(MILLI_PER_GPU):  # free milli never exceeds one GPU
            return node.name, state
        held = self._kinds.get(id(node.info))
        if held is None or held[0] is not node.info:
            if len(self._kinds) > 1_000_000:
                self._kinds.clear()
            info = node.info
            kind = (
                info.product,
                tuple(node.dev_index),
                tuple(node.dev_healthy),
                tuple(d.product for d in info.devices),
            )
            held = self._kinds[id(info)] = (info, kind)
        return held[1], state

    def scan_candidates(self, request, ctx, leaves):
        """The per-node walk: every node evaluated (from the per-node memo), sorted by increase then name."""
        cache = self._cache(ctx)
        meter, memo = cache.meter, cache.nodes
        key = (request.cpu_milli, request.memory_mib, request.gpus, request.gpu_milli, request.product)
        cpu, memory, gpus, milli = request.cpu_milli, request.memory_mib, request.gpus, request.gpu_milli
        per_device_memory = bool(request.gpu_memory_mib)
        wanted = None if leaves is None else set(leaves)
        if gpus > 0:  # only nodes with enough whole-free GPUs, straight from the ledger's buckets
            pool = bucket_walk(ctx.index, leaves, gpus, descending=False)
        else:
            pool = ctx.index.nodes.values()
        compute, shared, signature_of = self._compute, self._shared, self._signature
        ranked = []
        for node in pool:
            if node.cpu_free < cpu or node.mem_free < memory or not node.placeable:
                continue
            if wanted is not None and node.leaf_key not in wanted:
                continue
            if milli and node.free_milli < milli:
                continue
            if per_device_memory:
                result = compute(node, request, meter)
            else:
                signature = signature_of(node)
                entry = memo.get(node.name)
                if entry is None or entry[0] is not node or entry[1] != signature:
                    entry = memo[node.name] = (node, signature, {})
                results = entry[2]
                if key in results:
                    result = results[key]
                else:
                    result = results[key] = shared(node, request, cache, key, signature)
            if result is not None:
                ranked.append((result[0], node.name, node))
        offsets = self._offsets(request, ctx)
        if offsets:
            ranked = [(_offset(r[0], offsets, r[2]), r[1], r[2]) for r in ranked]
        ranked.sort(key=_rank_key)
        return (item[2] for item in ranked)


def _free_state(node) -> tuple:
    """What `_evaluate_for` compares to tell that a node's free state has not moved since its last answer
    (a copy of the device list: the node's own list changes in place)."""
    return node.cpu_free, node.mem_free, list(node.dev_free_milli)


_NO_OFFSETS: dict[str, float] = {}


def _offset(increase: float, offsets: dict[str, float], node) -> float:
    """The node's increase plus its model's offset, rounded as increases are (ties compare equal)."""
    return round(increase + offsets.get(node.info.product, 0.0), 6)


def _rank_key(item):
    return item[0], item[1]


def _free_vector(node) -> tuple[int, ...]:
    """Per-device free milli a pod could use: unhealthy devices and unknown-identity GPUs count as none."""
    free = node.dev_free_milli
    if node.unknown_gpus == 0 and all(node.dev_healthy):
        return tuple(free)
    out = [f if node.dev_healthy[p] else 0 for p, f in enumerate(free)]
    unknown = node.unknown_gpus
    for p in range(len(out)):
        if unknown <= 0:
            break
        if node.is_fully_free(p):
            out[p] = 0
            unknown -= 1
    return tuple(out)
