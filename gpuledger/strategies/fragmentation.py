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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from gpuledger.core.model import MILLI_PER_GPU, Request


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
    def of(cls, request: Request) -> PodShape:
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
    def from_shapes(
        cls, shapes: Iterable[PodShape], popularity: float = 0.95, memory_per_gpu_milli: float = 0.0
    ) -> TargetWorkload:
        """The most frequent shapes covering `popularity` of the pods, renormalised (the paper keeps 95%)."""
        return cls.from_counts(Counter(shapes), popularity, memory_per_gpu_milli)

    @classmethod
    def from_counts(
        cls, counts: Counter, popularity: float = 0.95, memory_per_gpu_milli: float = 0.0
    ) -> TargetWorkload:
        """As `from_shapes`, from shape -> number of pods."""
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
        return cls(
            tuple((shape, count / covered) for shape, count in kept),
            cpu / gpu_milli if gpu_milli else 0.0,
            memory_per_gpu_milli,
        )

    @classmethod
    def from_requests(cls, requests: Iterable[Request], popularity: float = 0.95) -> TargetWorkload:
        requests = list(requests)
        gpu = [r for r in requests if r.needs_gpu]
        gpu_milli = sum(r.gpus * MILLI_PER_GPU + (0 if r.gpus else r.gpu_milli) for r in gpu)
        memory = sum(r.memory_mib for r in gpu) / gpu_milli if gpu_milli else 0.0
        return cls.from_shapes((PodShape.of(r) for r in requests), popularity, memory)

    def __len__(self) -> int:
        return len(self.shapes)


def node_fragmentation(
    cpu_free: int, gpu_free: Sequence[int], product: str, workload: TargetWorkload
) -> float:
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

    def best_choice(
        self, cpu_free: int, gpu_free: Sequence[int], product: str, shape: PodShape
    ) -> Choice | None:
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

    The workload is re-derived after each of the first `refresh_every` requests, then after every
    `refresh_every`-th, at the moment the request is observed: it depends only on the sequence of requests,
    not on when (or whether) a strategy asks for it, so a walk that asks on every request and a scan that
    asks only when some node passes the filters see the same workload. An unchanged workload keeps its
    meter (and the meter's memo).
    """

    popularity: float = 0.95
    refresh_every: int = 256
    counts: Counter = field(default_factory=Counter)
    seen: int = 0
    memory_mib: int = 0  # of the GPU requests seen, for the memory-per-GPU ratio
    gpu_milli: int = 0
    _workload: TargetWorkload | None = None
    _meter: FragmentationMeter | None = None
    _shapes: dict = field(default_factory=dict, repr=False)  # request fields -> PodShape, built once

    def observe(self, request: Request) -> None:
        key = (request.cpu_milli, request.gpus, request.gpu_milli, request.product)
        shape = self._shapes.get(key)
        if shape is None:
            if len(self._shapes) > 100_000:
                self._shapes.clear()
            shape = self._shapes[key] = PodShape.of(request)
        self.counts[shape] += 1
        self.seen += 1
        if shape.total_milli:
            self.memory_mib += request.memory_mib
            self.gpu_milli += shape.total_milli
        if self.seen <= self.refresh_every or self.seen % self.refresh_every == 0:
            memory = self.memory_mib / self.gpu_milli if self.gpu_milli else 0.0
            workload = TargetWorkload.from_counts(self.counts, self.popularity, memory)
            if workload != self._workload:
                self._workload = workload

    def meter(self) -> FragmentationMeter:
        workload = self._workload if self._workload is not None else TargetWorkload(())
        if self._meter is None or self._meter.workload is not workload:
            self._meter = FragmentationMeter(workload)
        return self._meter


WORKLOAD_KEY = "fgd_workload"  # the `ScoreContext.extra` key carrying a TargetWorkload to fgd and fgd_host
