"""GPU fragmentation of a node with respect to a target workload (Weng et al., ATC'23, "Beware of
Fragmentation").

A node's free GPU milli is a *fragment* for a pod shape when that pod could not use it: every free milli on
the node if the pod cannot run there at all (too little CPU, not enough GPUs that fit, wrong GPU model, or a
pod that asks for no GPU), otherwise the free milli of the GPUs too small for the pod's per-GPU ask. The
node's fragmentation is the expectation of that over the target workload's pod shapes. FGD places each pod
where this expectation grows least.

Everything here is a pure function of per-device free milli, free CPU and the GPU model; the workload is an
input (from a trace, or from the requests seen so far), never a global. `FragmentationMeter` memoises by node
state: nodes of the same kind in the same state share one entry, which is what keeps FGD fast.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Sequence

from allocator.core.model import MILLI_PER_GPU, Request


def split_products(text: str | None) -> tuple[str, ...]:
    """A product constraint `A|B` as ("A", "B"); None or empty = any product."""
    if not text:
        return ()
    return tuple(p.strip() for p in text.split("|") if p.strip())


def product_matches(node_product: str, products: Sequence[str]) -> bool:
    """Any of `products` names the node's GPU (case-insensitive substring, as the ledger's filter does)."""
    if not products:
        return True
    node = node_product.lower()
    return any(p.lower() in node for p in products)


@dataclass(frozen=True, order=True)
class PodShape:
    """What fragmentation looks at in a pod: CPU, GPU count, per-GPU milli and the allowed GPU models."""

    cpu_milli: int = 0
    gpus: int = 0  # GPUs the pod occupies (1 for a share)
    milli: int = 0  # per GPU: 1000 for whole GPUs, 1..999 for a share, 0 for a pod without GPU
    products: tuple[str, ...] = ()

    @classmethod
    def of(cls, request: Request) -> "PodShape":
        products = split_products(request.product)
        if request.gpus > 0:
            return cls(request.cpu_milli, request.gpus, MILLI_PER_GPU, products)
        if request.gpu_milli > 0:
            return cls(request.cpu_milli, 1, min(request.gpu_milli, MILLI_PER_GPU), products)
        return cls(request.cpu_milli, 0, 0, ())

    @property
    def total_milli(self) -> int:
        return self.gpus * self.milli


@dataclass(frozen=True)
class TargetWorkload:
    """The pod shapes expected to arrive, with their probabilities (summing to 1), and the host resources
    GPU pods bring per milli-GPU (used by `fgd_host`; 0 = unknown)."""

    shapes: tuple[tuple[PodShape, float], ...]
    cpu_per_gpu_milli: float = 0.0
    memory_per_gpu_milli: float = 0.0

    @classmethod
    def from_shapes(cls, shapes: Iterable[PodShape], popularity: float = 0.95,
                    memory_per_gpu_milli: float = 0.0) -> "TargetWorkload":
        """The most frequent shapes covering `popularity` of the pods, renormalised (the paper keeps 95%)."""
        counts = Counter(shapes)
        total = sum(counts.values())
        if not total:
            return cls(())
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        kept, covered = [], 0
        for shape, count in ranked:
            if covered >= popularity * total:
                break
            kept.append((shape, count))
            covered += count
        gpu_milli = sum(count * shape.total_milli for shape, count in counts.items())
        cpu = sum(count * shape.cpu_milli for shape, count in counts.items() if shape.total_milli)
        return cls(tuple((shape, count / covered) for shape, count in kept),
                   cpu / gpu_milli if gpu_milli else 0.0, memory_per_gpu_milli)

    @classmethod
    def from_requests(cls, requests: Iterable[Request], popularity: float = 0.95) -> "TargetWorkload":
        requests = list(requests)
        gpu = [r for r in requests if r.needs_gpu]
        gpu_milli = sum(r.gpus * MILLI_PER_GPU + (0 if r.gpus else r.gpu_milli) for r in gpu)
        memory = sum(r.memory_mib for r in gpu) / gpu_milli if gpu_milli else 0.0
        return cls.from_shapes((PodShape.of(r) for r in requests), popularity, memory)

    def __len__(self) -> int:
        return len(self.shapes)


def node_fragmentation(cpu_free: int, gpu_free: Sequence[int], product: str,
                       workload: TargetWorkload) -> float:
    """Expected free GPU milli on the node that a pod drawn from `workload` could not use."""
    total = sum(gpu_free)
    if total <= 0:
        return 0.0
    frag = 0.0
    for shape, probability in workload.shapes:
        if shape.milli <= 0 or not product_matches(product, shape.products):
            frag += probability * total  # a pod without GPU, or one barred from this model, uses none of it
            continue
        fitting = [g for g in gpu_free if g >= shape.milli]
        if len(fitting) >= shape.gpus and cpu_free >= shape.cpu_milli:
            frag += probability * (total - sum(fitting))  # only the GPUs too small for it are lost
        else:
            frag += probability * total
    return frag


@dataclass(frozen=True)
class Choice:
    """Where a pod would go on one node and what that does to the node's fragmentation."""

    increase: float  # fragmentation after minus before (milli-GPU); lower is better
    devices: tuple[int, ...]  # device indices (the shared device, or the whole ones)


@dataclass
class FragmentationMeter:
    """`node_fragmentation` for one workload, memoised by (model, free CPU, sorted free milli); shapes are
    grouped by GPU ask so that one node state costs a few bisects per group, not a pass per shape."""

    workload: TargetWorkload
    _memo: dict = field(default_factory=dict, repr=False)
    _plans: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._by_product: dict[str, tuple[float, tuple]] = {}

    def _compiled(self, product: str) -> tuple[float, tuple]:
        """(probability of shapes that lose every free milli on this model, the other shapes grouped by
        (gpus, per-GPU milli) with their CPU asks sorted and cumulative probabilities)."""
        compiled = self._by_product.get(product)
        if compiled is None:
            always = 0.0
            groups: dict[tuple[int, int], list[tuple[int, float]]] = {}
            for shape, probability in self.workload.shapes:
                if shape.milli <= 0 or not product_matches(product, shape.products):
                    always += probability
                else:
                    groups.setdefault((shape.gpus, shape.milli), []).append((shape.cpu_milli, probability))
            packed = []
            for (gpus, milli), asks in sorted(groups.items()):
                asks.sort()
                cumulative, running = [0.0], 0.0
                for _, probability in asks:
                    running += probability
                    cumulative.append(running)
                packed.append((gpus, milli, tuple(cpu for cpu, _ in asks), tuple(cumulative), running))
            compiled = self._by_product[product] = (always, tuple(packed))
        return compiled

    def fragmentation(self, cpu_free: int, gpu_free: Sequence[int], product: str) -> float:
        key = (product, cpu_free, tuple(sorted(gpu_free)))
        value = self._memo.get(key)
        if value is None:
            if len(self._memo) > 500_000:
                self._memo.clear()
            value = self._memo[key] = self._compute(*key)
        return value

    def _compute(self, product: str, cpu_free: int, free_asc: tuple[int, ...]) -> float:
        total = sum(free_asc)
        if total <= 0:
            return 0.0
        always, groups = self._compiled(product)
        frag = always * total
        count = len(free_asc)
        below = [0]  # below[i] = free milli of the i smallest devices
        for g in free_asc:
            below.append(below[-1] + g)
        for gpus, milli, cpus, cumulative, mass in groups:
            small = bisect_left(free_asc, milli)  # devices too small for this per-GPU ask
            if count - small >= gpus:
                fed = cumulative[bisect_right(cpus, cpu_free)]  # shapes whose CPU ask the node can meet
                frag += fed * below[small] + (mass - fed) * total
            else:
                frag += mass * total
        return frag

    def best_choice(self, cpu_free: int, gpu_free: Sequence[int], product: str,
                    shape: PodShape) -> Choice | None:
        """The device choice on this node that raises fragmentation least; None if the pod does not fit.

        A share goes on the fitting device whose choice leaves the least fragmentation (ties: the fullest
        device, then the lowest index); whole GPUs take the lowest-indexed idle devices.
        """
        before = self.fragmentation(cpu_free, gpu_free, product)
        cpu_after = cpu_free - shape.cpu_milli
        if shape.milli <= 0:
            return Choice(self.fragmentation(cpu_after, gpu_free, product) - before, ())
        if shape.milli < MILLI_PER_GPU and shape.gpus == 1:
            best: tuple[float, int, int] | None = None
            tried: set[int] = set()
            for index, free in enumerate(gpu_free):
                if free < shape.milli or free in tried:
                    continue
                tried.add(free)  # devices with the same free milli are interchangeable
                after = list(gpu_free)
                after[index] = free - shape.milli
                candidate = (self.fragmentation(cpu_after, after, product) - before, free, index)
                if best is None or candidate < best:
                    best = candidate
            return None if best is None else Choice(best[0], (best[2],))
        idle = [i for i, free in enumerate(gpu_free) if free >= MILLI_PER_GPU]
        if len(idle) < shape.gpus:
            return None
        taken = idle[: shape.gpus]
        after = list(gpu_free)
        for index in taken:
            after[index] = 0
        return Choice(self.fragmentation(cpu_after, after, product) - before, tuple(taken))


@dataclass
class WorkloadTracker:
    """The target workload learnt from the requests seen so far (for live admission, where no trace exists).

    The workload is re-derived every `refresh_every` requests so that the meter's memo stays useful; the
    result depends only on the sequence of requests, so it is deterministic.
    """

    popularity: float = 0.95
    refresh_every: int = 256
    counts: Counter = field(default_factory=Counter)
    seen: int = 0
    memory_mib: int = 0  # of the GPU requests seen, for the memory-per-GPU ratio
    gpu_milli: int = 0
    _seen_at_refresh: int = 0
    _meter: FragmentationMeter | None = None

    def observe(self, request: Request) -> None:
        shape = PodShape.of(request)
        self.counts[shape] += 1
        self.seen += 1
        if shape.total_milli:
            self.memory_mib += request.memory_mib
            self.gpu_milli += shape.total_milli

    def meter(self) -> FragmentationMeter:
        seen = self.seen
        if self._meter is None or seen - self._seen_at_refresh >= self.refresh_every:
            memory = self.memory_mib / self.gpu_milli if self.gpu_milli else 0.0
            workload = TargetWorkload.from_shapes(self.counts.elements(), self.popularity, memory)
            self._meter = FragmentationMeter(workload)
            self._seen_at_refresh = seen
        return self._meter


# --- strategies -------------------------------------------------------------------------------------------
# FGD and its host-aware variant are ledger strategies like any other: the ledger filters nodes, these choose
# devices and score. The target workload comes from `ctx.extra[WORKLOAD_KEY]` (a TargetWorkload, e.g. the
# simulator's trace) or, when absent, is learnt from the requests this ledger has seen.

import weakref  # noqa: E402  (strategy plumbing below the pure math)

from allocator import strategies as _strategies  # noqa: E402
from allocator.core.model import DeviceShare  # noqa: E402

WORKLOAD_KEY = "fgd_workload"


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
            kind = (info.product, tuple(node.dev_index), tuple(node.dev_healthy),
                    tuple(d.product for d in info.devices))
            held = self.kinds[id(info)] = (info, kind)
        return held[1]


class FragmentationGradientDescent(_strategies.Strategy):
    """FGD: the node and device whose placement raises the node's expected fragmentation least.

    Score = -(fragmentation after - fragmentation before), ties to the lowest node name. Provides a candidate
    walk that evaluates every node once per request from a per-node memo (a node's entry changes only when
    its free state does), so the ledger does not re-filter every node.
    """

    name = "fgd"

    def __init__(self) -> None:
        self._meters: dict[int, tuple[TargetWorkload, FragmentationMeter]] = {}
        self._trackers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._caches: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
        self._last_ctx: _strategies.ScoreContext | None = None
        self._last_cache: _NodeCache | None = None

    # ------------------------------------------------------------------ inputs
    def meter(self, ctx: _strategies.ScoreContext) -> FragmentationMeter:
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

    def _cache(self, ctx: _strategies.ScoreContext) -> _NodeCache:
        if ctx is self._last_ctx:  # the ledger asks once per node with the same per-request context
            return self._last_cache
        meter = self.meter(ctx)
        cache = self._caches.get(ctx.index)
        if cache is None or cache.meter is not meter:
            cache = self._caches[ctx.index] = _NodeCache(meter)
        self._last_ctx, self._last_cache = ctx, cache
        return cache

    # ------------------------------------------------------------------ evaluation
    def extra_cost(self, meter: FragmentationMeter, node, request: Request, taken_milli: int) -> float:
        """Added to the fragmentation increase; FGD itself adds nothing."""
        return 0.0

    uses_memory = False  # whether free host memory enters the evaluation (beyond the fit check)

    def _signature(self, node) -> tuple:
        """The node's free state as far as an evaluation can tell (`fully_free` catches a device held only by
        memory shares, whose free milli still reads 1000)."""
        if self.uses_memory:
            return (node.cpu_free, node.mem_free, node.unknown_gpus, node.fully_free,
                    tuple(node.dev_free_milli))
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
            devices = _strategies.choose_whole_devices(node, request)
            if devices is None:
                return None
            after = list(free)
            for index in devices:
                after[node.pos[index]] = 0
            fit = _strategies.Fit(devices=devices)
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
                if not _strategies.device_ok(node, p, request):
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
            fit = _strategies.Fit(shares=(DeviceShare(device=node.dev_index[best[2]], milli=milli,
                                                      memory_mib=memory),))
            taken = milli
        else:
            after, fit, taken = free, _strategies.Fit(), 0
        increase = meter.fragmentation(cpu_after, after, product) - before
        # rounded so that equal increases compare equal whatever the order of float sums (ties go by name)
        return round(increase + self.extra_cost(meter, node, request, taken), 6), fit

    # ------------------------------------------------------------------ the Strategy interface
    def choose_devices(self, node, request, ctx):
        result = self._evaluate(node, request, self._cache(ctx))
        return None if result is None else result[1]

    def score(self, node, request, fit, ctx):
        result = self._evaluate(node, request, self._cache(ctx))
        return 0.0 if result is None else -result[0]

    def candidates(self, request, ctx, leaves):
        """Every node that could hold the request, by fragmentation increase then name (the ledger's order).

        The hot loop of a simulation: per node it costs one signature and one dict lookup unless the node's
        state changed since a request of the same shape last looked at it.
        """
        cache = self._cache(ctx)
        meter, memo = cache.meter, cache.nodes
        key = (request.cpu_milli, request.memory_mib, request.gpus, request.gpu_milli, request.product)
        cpu, memory, gpus, milli = request.cpu_milli, request.memory_mib, request.gpus, request.gpu_milli
        per_device_memory = bool(request.gpu_memory_mib)
        wanted = None if leaves is None else set(leaves)
        if gpus > 0:  # only nodes with enough whole-free GPUs, straight from the ledger's buckets
            pool = _strategies.bucket_walk(ctx.index, leaves, gpus, descending=False)
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
        ranked.sort(key=_rank_key)
        return (item[2] for item in ranked)


def _rank_key(item):
    return item[0], item[1]


class HostAwareFGD(FragmentationGradientDescent):
    """FGD plus the GPUs a node's remaining CPU and memory could no longer feed (this project's variant).

    FGD asks whether *one* more pod of each shape fits; it does not see a node whose CPU is being eaten by
    CPU-only pods until the last GPU pod no longer fits, and by then several idle GPUs are stranded. This adds
    `weight` x the increase of `stranded = max(0, free GPU milli - min(free CPU / c, free memory / m))`, where
    c and m are the workload's CPU and memory per milli-GPU: the free GPU milli the node's host resources
    cannot serve at the workload's usual ratio.
    """

    name = "fgd_host"
    weight = 1.0
    uses_memory = True

    def extra_cost(self, meter, node, request, taken_milli):
        workload = meter.workload
        if not workload.cpu_per_gpu_milli and not workload.memory_per_gpu_milli:
            return 0.0
        total = node.free_milli
        if total <= 0:
            return 0.0
        before = _stranded(total, node.cpu_free, node.mem_free, workload)
        after = _stranded(total - taken_milli, node.cpu_free - request.cpu_milli,
                          node.mem_free - request.memory_mib, workload)
        return self.weight * (after - before)


def _stranded(free_milli: float, cpu_free: float, mem_free: float, workload: TargetWorkload) -> float:
    """Free GPU milli that the node's CPU and memory cannot feed at the workload's per-GPU ratios."""
    feedable = float("inf")
    if workload.cpu_per_gpu_milli:
        feedable = cpu_free / workload.cpu_per_gpu_milli
    if workload.memory_per_gpu_milli:
        feedable = min(feedable, mem_free / workload.memory_per_gpu_milli)
    return max(0.0, free_milli - feedable)


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


_strategies.register("fgd", FragmentationGradientDescent, aliases=("fragmentation", "fgd_score"))
_strategies.register("fgd_host", HostAwareFGD, aliases=("fgdHost", "fgd-host"))
