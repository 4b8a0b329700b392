"""Fair order: which waiting workload goes next, among queues and within one.

Among queues, the next workload comes from the queue furthest below its weighted fair share. A queue's share
is the dominant resource share of what it borrows: for each quota bucket it uses above its quota, the borrowed
part over the cluster's GPUs of those products, and the same part of the CPU and memory it holds on those
nodes over theirs (where a product is scarce, a queue that takes its nodes' CPUs takes its GPUs too); the
largest of these, divided by the queue's weight. A queue within its quota has a share of 0, and among such
queues the one using the least of its quota goes first. A two-level tree is walked top down: the
organisation first, then the team within it. Within a queue: higher priority first, then earlier arrival.

Pure; the same answer for the same inputs.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable
from dataclasses import dataclass, field

from gpuledger.core.model import MILLI_PER_GPU, Request
from gpuledger.core.queues.gpu_queues import QueueSet
from gpuledger.core.queues.queue_rule import order_key
from gpuledger.core.queues.quotas import Capacity, Usage, Use


@dataclass(frozen=True)
class WaitingWorkload:
    """A workload waiting for GPUs, as the fair order sees it (a pod, or a gang as one): one entry of the
    ledger's line of waiting pods (gpuledger.core.queues.waiting) or of the GPUWorkload queue, with its
    queue."""

    key: str
    queue: str
    priority: int
    arrival: float  # when it began to wait (or a sequence number: only the order matters)
    use: Use = field(default_factory=Use)  # what it asks, by the product it insists on ("" where any will do)

    @classmethod
    def of_request(cls, key: str, queue: str, request: Request, arrival: float) -> WaitingWorkload:
        """From the request of its (first) pod: every pod of a gang, on the product it insists on."""
        pods = request.group.size if request.group is not None and request.group.size > 1 else 1
        milli = request.gpus * MILLI_PER_GPU if request.gpus else request.gpu_milli
        use = Use.of(
            [(request.product or "", milli * pods, request.cpu_milli * pods, request.memory_mib * pods)]
        )
        return cls(key, queue, request.priority, arrival, use)


def dominant_share(queues: QueueSet, usage: Usage, capacity: Capacity, queue: str) -> float:
    """The largest share of any resource the queue borrows, over its weight (0 within quota)."""
    q = queues[queue]
    share = 0.0
    for bucket in usage.buckets(queue):
        borrowed = usage.borrowed(queue, bucket)
        if borrowed <= 0:
            continue
        used = usage.by_queue[queue][bucket]
        part = borrowed / used[0]
        cap = capacity.of_bucket(q, bucket)
        if not cap.milli:  # an estimate's product ("" for any): the whole cluster
            cap = capacity.total()
        share = max(
            share,
            borrowed / cap.milli if cap.milli else 1.0,  # (a cluster with no GPU)
            part * used[1] / cap.cpu_milli if cap.cpu_milli else 0.0,
            part * used[2] / cap.memory_mib if cap.memory_mib else 0.0,
        )
    return share / q.weight


def quota_used(queues: QueueSet, usage: Usage, queue: str) -> float:
    """The largest fraction of a quota entry the queue uses (inf where it uses what it has no quota for)."""
    q = queues[queue]
    worst = 0.0
    for bucket in usage.buckets(queue):
        used = usage.milli(queue, bucket)
        quota = q.quota(bucket).gpus * MILLI_PER_GPU
        if used:
            worst = max(worst, used / quota if quota else float("inf"))
    return worst


def queue_key(queues: QueueSet, usage: Usage, capacity: Capacity, queue: str) -> tuple[float, float, str]:
    """Smaller goes first: furthest below its weighted fair share, then least of its quota used, then name."""
    return (dominant_share(queues, usage, capacity, queue), quota_used(queues, usage, queue), queue)


def within_queue_key(w: WaitingWorkload) -> tuple[int, float, str]:
    """The queue rule's order (gpuledger.core.queues.queue_rule): priority, then arrival."""
    return order_key(w.priority, w.arrival, w.key)


def next_waiting(
    queues: QueueSet, usage: Usage, capacity: Capacity, waiting: Iterable[WaitingWorkload]
) -> WaitingWorkload | None:
    """The workload that goes next: from the top-level queue, then the child queue, furthest below its fair
    share; within that queue, the highest priority, then the earliest arrival."""
    heads: dict[str, WaitingWorkload] = {}
    for w in waiting:
        head = heads.get(w.queue)
        if head is None or within_queue_key(w) < within_queue_key(head):
            heads[w.queue] = w
    if not heads:
        return None
    tops = {queues.top(name) for name in heads}
    top = min(tops, key=lambda name: queue_key(queues, usage, capacity, name))
    leaves = [name for name in heads if queues.top(name) == top]
    leaf = min(leaves, key=lambda name: queue_key(queues, usage, capacity, name))
    return heads[leaf]


def line(
    queues: QueueSet, usage: Usage, capacity: Capacity, waiting: Iterable[WaitingWorkload]
) -> list[WaitingWorkload]:
    """Every waiting workload in the order they would go if each were placed in turn (its ask added to its
    queue's use before the next is chosen): the place in line `gpuledger workloads` shows. The use a workload
    asks for is an estimate until the ledger places it (its product may be any)."""
    per_queue: dict[str, list[tuple[tuple[int, float, str], WaitingWorkload]]] = {}
    for w in waiting:
        per_queue.setdefault(w.queue, []).append((within_queue_key(w), w))
    for entries in per_queue.values():
        heapq.heapify(entries)
    usage = usage.copy()
    out: list[WaitingWorkload] = []
    while per_queue:
        tops = {queues.top(name) for name in per_queue}
        top = min(tops, key=lambda name: queue_key(queues, usage, capacity, name))
        leaf = min(
            (name for name in per_queue if queues.top(name) == top),
            key=lambda name: queue_key(queues, usage, capacity, name),
        )
        _, w = heapq.heappop(per_queue[leaf])
        if not per_queue[leaf]:
            del per_queue[leaf]
        out.append(w)
        usage.add(leaf, w.use)
    return out
