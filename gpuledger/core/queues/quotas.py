"""Quota accounting: what each queue uses of its quota, what it borrows, and whether a workload may start.

Use is counted by the GPU product of the nodes it sits on, in milli-GPUs (a shared GPU counts its share), with
the CPU and memory held beside the GPUs; each queue files a product under its quota entry for it (`any` for
products it does not name). A parent queue uses what its children use. Borrowing is use above quota: a queue
may borrow up to its borrowing limit, and only from what others do not use: the GPUs a queue keeps (its quota
less its lending limit) stay free while it does not use them, so a borrower must leave them free.

Pure: what the ledger holds enters as `Use` values and a `Capacity`, both read by
gpuledger.core.queues.ledger_view.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from gpuledger.core.model import MILLI_PER_GPU
from gpuledger.core.queues.gpu_queues import ANY_PRODUCT, GPUQueue, QueueError, QueueSet

UsePart = tuple[str, int, int, int]  # (GPU product, milli-GPUs, CPU milli, memory MiB)


@dataclass(frozen=True)
class Use:
    """What a workload holds (or would hold), by the GPU product of the nodes it holds it on."""

    parts: tuple[UsePart, ...] = ()  # one per product, sorted

    @classmethod
    def of(cls, parts: Iterable[UsePart]) -> Use:
        merged: dict[str, list[int]] = {}
        for product, milli, cpu, memory in parts:
            m = merged.setdefault(product, [0, 0, 0])
            m[0] += milli
            m[1] += cpu
            m[2] += memory
        return cls(tuple((p, m[0], m[1], m[2]) for p, m in sorted(merged.items())))

    def __add__(self, other: Use) -> Use:
        return Use.of((*self.parts, *other.parts))

    @property
    def milli(self) -> int:
        return sum(p[1] for p in self.parts)

    def milli_of(self, product: str) -> int:
        return sum(p[1] for p in self.parts if p[0] == product)


@dataclass(frozen=True)
class ProductCapacity:
    milli: int = 0  # healthy GPUs, in milli-GPUs
    free_milli: int = 0
    cpu_milli: int = 0  # of the nodes with GPUs of the product
    memory_mib: int = 0

    def __add__(self, o: ProductCapacity) -> ProductCapacity:
        return ProductCapacity(
            self.milli + o.milli,
            self.free_milli + o.free_milli,
            self.cpu_milli + o.cpu_milli,
            self.memory_mib + o.memory_mib,
        )


@dataclass(frozen=True)
class Capacity:
    """The cluster's GPU nodes by product: what there is and what is free now."""

    products: Mapping[str, ProductCapacity] = field(default_factory=dict)

    def of_bucket(self, queue: GPUQueue, bucket: str) -> ProductCapacity:
        """The products `queue` files under `bucket`, summed."""
        total = ProductCapacity()
        for product, cap in self.products.items():
            if queue.bucket(product) == bucket:
                total = total + cap
        return total

    def total(self) -> ProductCapacity:
        out = ProductCapacity()
        for cap in self.products.values():
            out = out + cap
        return out

    def free_milli(self, product: str | None = None) -> int:
        if product is None:
            return sum(c.free_milli for c in self.products.values())
        wanted = product.lower()
        return sum(c.free_milli for p, c in self.products.items() if p.lower() == wanted)


class Usage:
    """Per queue (leaves and parents) and quota bucket: [milli-GPUs, CPU milli, memory MiB] in use."""

    def __init__(self, queues: QueueSet):
        self.queues = queues
        self.by_queue: dict[str, dict[str, list[int]]] = {name: {} for name in queues.queues}

    @classmethod
    def of(cls, queues: QueueSet, uses: Iterable[tuple[str, Use]]) -> Usage:
        """From (leaf queue, use) of every running workload."""
        usage = cls(queues)
        for queue, use in uses:
            usage.add(queue, use)
        return usage

    def copy(self) -> Usage:
        out = Usage.__new__(Usage)
        out.queues = self.queues
        out.by_queue = {q: {b: list(v) for b, v in buckets.items()} for q, buckets in self.by_queue.items()}
        return out

    def add(self, queue: str, use: Use, sign: int = 1) -> None:
        for name in self.queues.path(queue):
            q = self.queues[name]
            buckets = self.by_queue[name]
            for product, milli, cpu, memory in use.parts:
                v = buckets.setdefault(q.bucket(product), [0, 0, 0])
                v[0] += sign * milli
                v[1] += sign * cpu
                v[2] += sign * memory

    def milli(self, queue: str, bucket: str) -> int:
        v = self.by_queue[queue].get(bucket)
        return v[0] if v else 0

    def buckets(self, queue: str) -> list[str]:
        """The buckets the queue has a quota in or uses."""
        q = self.queues[queue]
        return sorted(
            {*(e.product for e in q.quotas), *(b for b, v in self.by_queue[queue].items() if any(v))}
        )

    def borrowed(self, queue: str, bucket: str) -> int:
        """Milli-GPUs used above the quota of `bucket`."""
        return max(0, self.milli(queue, bucket) - self.queues[queue].quota(bucket).gpus * MILLI_PER_GPU)

    def total(self, queue: str) -> int:
        return sum(v[0] for v in self.by_queue[queue].values())

    def borrowed_total(self, queue: str) -> int:
        return sum(self.borrowed(queue, b) for b in self.buckets(queue))


def usage_by_namespace(
    queues: QueueSet, namespace_labels: Mapping[str, Mapping[str, str]], held: Iterable[tuple[str, Use]]
) -> Usage:
    """Usage from what each namespace's running workloads hold ((namespace, use) pairs: a pod's or a gang's
    placement read by LedgerView.use_of), each namespace counted in its queue. A namespace two queues select
    counts in the default queue (its new workloads are refused until one selects it)."""
    of: dict[str, str] = {}
    usage = Usage(queues)
    for namespace, use in held:
        queue = of.get(namespace)
        if queue is None:
            try:
                queue = queues.queue_of(namespace, namespace_labels.get(namespace, {}))
            except QueueError:
                queue = queues.default
            of[namespace] = queue
        usage.add(queue, use)
    return usage


def quota_refusal(
    queues: QueueSet, usage: Usage, capacity: Capacity, queue: str, use: Use, freed: Use | None = None
) -> str | None:
    """None when a workload of `queue` holding `use` may start now as far as quotas go; else why not, in
    words. `usage` is what runs now; `freed` (victims about to go) is free beside `capacity`'s free GPUs."""
    for name in queues.path(queue):
        q = queues[name]
        per_bucket: dict[str, int] = {}
        for product, milli, _, _ in use.parts:
            per_bucket[q.bucket(product)] = per_bucket.get(q.bucket(product), 0) + milli
        for bucket, milli in sorted(per_bucket.items()):
            entry = q.quota(bucket)
            before = usage.milli(name, bucket)
            after = before + milli
            if entry.borrowing_limit is not None:
                limit = (entry.gpus + entry.borrowing_limit) * MILLI_PER_GPU
                if after > limit:
                    return (
                        f"queue {name} would use {gpus_text(after)} GPU(s) of {_bucket_words(bucket)}: its "
                        f"quota is {entry.gpus} and it may borrow {entry.borrowing_limit} more"
                    )
            borrows_more = after > entry.gpus * MILLI_PER_GPU and after > before
            if borrows_more:
                kept = _kept_free(queues, usage, name)
                refusal = _leaves_kept_free(capacity, use, freed, kept)
                if refusal:
                    return f"queue {name} would borrow GPUs other queues keep for themselves: {refusal}"
    return None


def _kept_free(queues: QueueSet, usage: Usage, borrower: str) -> dict[str | None, int]:
    """Milli-GPUs the borrower's sibling queues keep (quota less lending limit) and do not use: by product
    (lower case) for quota entries that name one, under None for every product."""
    parent = queues[borrower].parent
    siblings = queues.children.get(parent, ()) if parent is not None else queues.top_level()
    out: dict[str | None, int] = {None: 0}
    for name in siblings:
        if name == borrower:
            continue
        for entry in queues[name].quotas:
            unused = max(0, entry.kept * MILLI_PER_GPU - usage.milli(name, entry.product))
            if unused:
                out[None] += unused
                if entry.product != ANY_PRODUCT:
                    key = entry.product.lower()
                    out[key] = out.get(key, 0) + unused
    return out


def _leaves_kept_free(capacity: Capacity, use: Use, freed: Use | None, kept: dict[str | None, int]) -> str:
    extra = freed or Use()
    free_total = capacity.free_milli() + extra.milli - use.milli
    if free_total < kept[None]:
        return f"{gpus_text(kept[None])} GPU(s) kept, {gpus_text(max(0, free_total))} would stay free"
    for product, need in sorted((k, v) for k, v in kept.items() if k is not None):
        free = (
            capacity.free_milli(product)
            + sum(m for p, m, _, _ in extra.parts if p.lower() == product)
            - sum(m for p, m, _, _ in use.parts if p.lower() == product)
        )
        if any(p.lower() == product for p, _, _, _ in use.parts) and free < need:
            return f"{gpus_text(need)} GPU(s) of {product} kept, {gpus_text(max(0, free))} would stay free"
    return ""


def gpus_text(milli: int) -> str:
    """Milli-GPUs as GPUs in words (whole where whole)."""
    return f"{milli // MILLI_PER_GPU}" if milli % MILLI_PER_GPU == 0 else f"{milli / MILLI_PER_GPU:.3g}"


def _bucket_words(bucket: str) -> str:
    return "any product" if bucket == ANY_PRODUCT else f"product {bucket}"
