"""Each GPU queue's standing from API objects: quota, use, borrowing, lending and fair share, by the core.

The operator's read (`gpuledger queues`, `gpuledger status`) may not reach into gpuledger.core, and must not
count by a rule of its own: this module hands it the core's answers. GPUQueue objects are parsed by
gpuledger.core.queues.gpu_queues (the same refusals), Nodes by gpuledger.core.pods.objects (their product, CPU
and memory), use is counted by gpuledger.core.queues.quotas, and the share and the fair order are
gpuledger.core.queues.fair_share's.

The ledger's own read (`queue_status`: each GPUQueue's `.status`) goes through `standing_of` and
`status_body` with the ledger's books in place of the API objects, so both say the same.

Pure: plain dicts and tuples in, dataclasses out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuledger.core.model import MILLI_PER_GPU
from gpuledger.core.pods.objects import node_from_object
from gpuledger.core.queues.fair_share import dominant_share, queue_key, quota_used
from gpuledger.core.queues.gpu_queues import ANY_PRODUCT, QueueError, QueueSet, queue_from_object
from gpuledger.core.queues.queue_book import namespace_queue
from gpuledger.core.queues.quotas import Capacity, ProductCapacity, Usage, Use

__all__ = [
    "ANY_PRODUCT",
    "BucketStanding",
    "Held",
    "QueueError",
    "QueueStanding",
    "Standing",
    "standing",
    "standing_of",
    "status_body",
]


@dataclass(frozen=True)
class Held:
    """What one running pod holds: its namespace, its node, milli-GPUs, and the CPU and memory it asked."""

    namespace: str
    node: str
    milli: int
    cpu_milli: int = 0
    memory_mib: int = 0


@dataclass(frozen=True)
class BucketStanding:
    """One quota entry of a queue (a product, or `any`), or a product it uses without an entry (quota 0)."""

    product: str
    quota_gpus: int
    borrowing_limit: int | None  # GPUs it may use above quota (None: no limit)
    lending_limit: int | None  # GPUs of its unused quota others may borrow (None: all of it)
    used_milli: int
    borrowed_milli: int  # used above the quota
    lendable_milli: int  # unused quota others may borrow now (at most the lending limit)


@dataclass(frozen=True)
class QueueStanding:
    name: str
    parent: str | None
    children: tuple[str, ...]
    weight: float
    default: bool  # the queue of namespaces no selector names
    implicit: bool  # the default queue no GPUQueue object declares (no quota)
    buckets: tuple[BucketStanding, ...]
    share: float  # the weighted dominant share of what it borrows (0 within quota)
    quota_used: float  # the largest fraction of a quota entry it uses (inf: uses what it has no quota for)
    fair_order: int | None  # leaf queues: 1 is served first when every queue has work waiting; None: a parent

    @property
    def quota_gpus(self) -> int:
        return sum(b.quota_gpus for b in self.buckets)

    @property
    def used_milli(self) -> int:
        return sum(b.used_milli for b in self.buckets)

    @property
    def borrowed_milli(self) -> int:
        return sum(b.borrowed_milli for b in self.buckets)

    @property
    def lendable_milli(self) -> int:
        return sum(b.lendable_milli for b in self.buckets)


@dataclass(frozen=True)
class Standing:
    queues: tuple[QueueStanding, ...]  # parents before their children, else by name
    queue_of_namespace: Mapping[str, str]  # every namespace named -> its leaf queue
    conflicts: Mapping[
        str, str
    ]  # namespace -> why it belongs to no queue (two select it); counted in default


def standing(
    queue_objects: Iterable[Mapping[str, Any]],
    namespace_labels: Mapping[str, Mapping[str, str]],
    nodes: Iterable[dict],
    held: Iterable[Held],
) -> Standing:
    """The standing of every queue (the implicit default included) from the GPUQueue objects, every
    namespace's labels, the Node objects and what running pods hold. Raises QueueError (naming the field)
    when the GPUQueues cannot be honoured as a whole."""
    parsed = [queue_from_object(o) for o in queue_objects]
    declared = {q.name for q in parsed}
    queues = QueueSet(parsed)
    of_namespace: dict[str, str] = {}
    conflicts: dict[str, str] = {}
    for namespace, labels in sorted(namespace_labels.items()):
        of_namespace[namespace], why = namespace_queue(queues, namespace, labels)
        if why:
            conflicts[namespace] = why
    held = list(held)
    capacity, product_of = _capacity(nodes, held)
    usage = Usage(queues)
    for h in held:
        queue = of_namespace.get(h.namespace)
        if queue is None:
            queue = namespace_queue(queues, h.namespace, namespace_labels.get(h.namespace, {}))[0]
        usage.add(queue, Use.of([(product_of.get(h.node, ""), h.milli, h.cpu_milli, h.memory_mib)]))
    return standing_of(queues, declared, usage, capacity, of_namespace, conflicts)


def standing_of(
    queues: QueueSet,
    declared: Iterable[str],
    usage: Usage,
    capacity: Capacity,
    of_namespace: Mapping[str, str] | None = None,
    conflicts: Mapping[str, str] | None = None,
) -> Standing:
    """The standing of every queue from what the core counts: the queues, those a GPUQueue object declares,
    what each uses and the cluster's capacity (from API objects by `standing`, from the ledger's books by
    the ledger service)."""
    declared = set(declared)
    order = _fair_order(queues, usage, capacity)
    out = []
    for name in _tree_order(queues):
        q = queues[name]
        buckets = []
        for bucket in usage.buckets(name):
            entry = q.quota(bucket)
            used = usage.milli(name, bucket)
            unused = max(0, entry.gpus * MILLI_PER_GPU - used)
            lendable = (
                unused if entry.lending_limit is None else min(unused, entry.lending_limit * MILLI_PER_GPU)
            )
            buckets.append(
                BucketStanding(
                    bucket,
                    entry.gpus,
                    entry.borrowing_limit,
                    entry.lending_limit,
                    used,
                    usage.borrowed(name, bucket),
                    lendable,
                )
            )
        out.append(
            QueueStanding(
                name=name,
                parent=q.parent,
                children=queues.children.get(name, ()),
                weight=q.weight,
                default=name == queues.default,
                implicit=name not in declared,
                buckets=tuple(buckets),
                share=dominant_share(queues, usage, capacity, name),
                quota_used=quota_used(queues, usage, name),
                fair_order=order.get(name),
            )
        )
    return Standing(tuple(out), dict(of_namespace or {}), dict(conflicts or {}))


def gpus(milli: int) -> float | int:
    """Milli-GPUs as GPUs: whole where whole."""
    return milli // MILLI_PER_GPU if milli % MILLI_PER_GPU == 0 else round(milli / MILLI_PER_GPU, 3)


def status_body(q: QueueStanding, waiting: int) -> dict[str, Any]:
    """A GPUQueue's `.status` as its CRD's schema says (gpuledger.controller.crd_fields.queue_status), less
    `updatedTime` and `conditions`, which the writer adds."""
    return {
        "quota": q.quota_gpus,
        "used": gpus(q.used_milli),
        "borrowed": gpus(q.borrowed_milli),
        "waiting": waiting,
        "share": round(q.share, 6),
        "products": [
            {
                "product": b.product,
                "quota": b.quota_gpus,
                "used": gpus(b.used_milli),
                "borrowed": gpus(b.borrowed_milli),
            }
            for b in q.buckets
        ],
    }


def _capacity(nodes: Iterable[dict], held: list[Held]) -> tuple[Capacity, dict[str, str]]:
    """The cluster's GPU nodes summed by product (healthy GPUs; free only on placeable nodes), as the ledger
    counts them (gpuledger.core.queues.ledger_view), and each node's product."""
    held_on: dict[str, int] = {}
    for h in held:
        held_on[h.node] = held_on.get(h.node, 0) + h.milli
    sums: dict[str, ProductCapacity] = {}
    product_of: dict[str, str] = {}
    for obj in nodes:
        info = node_from_object(obj)
        product_of[info.name] = info.product
        if not info.devices:
            continue
        total = MILLI_PER_GPU * sum(1 for d in info.devices if d.healthy)
        placeable = info.ready and not info.unschedulable and info.gpu_schedulable
        free = max(0, total - held_on.get(info.name, 0)) if placeable else 0
        cap = ProductCapacity(total, free, info.cpu_milli, info.memory_mib)
        sums[info.product] = sums.get(info.product, ProductCapacity()) + cap
    return Capacity(dict(sorted(sums.items()))), product_of


def _fair_order(queues: QueueSet, usage: Usage, capacity: Capacity) -> dict[str, int]:
    """Leaf queues in the order the fair order serves them when each has work waiting: the top-level queue
    furthest below its share first, then the child queue within it (as fair_share.next_waiting chooses)."""

    def key(name: str) -> tuple:
        return (
            queue_key(queues, usage, capacity, queues.top(name)),
            queue_key(queues, usage, capacity, name),
        )

    return {name: n + 1 for n, name in enumerate(sorted(queues.leaves(), key=key))}


def _tree_order(queues: QueueSet) -> list[str]:
    out = []
    for top in queues.top_level():
        out.append(top)
        out += sorted(queues.children.get(top, ()))
    return out
