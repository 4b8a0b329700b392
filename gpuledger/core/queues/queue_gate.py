"""Quotas and the fair order at the ledger's door: whether a request's queue may take what the ledger would
give it now, and which queue's waiting work goes first.

A `QueueGate` reads what each queue uses and the cluster's capacity once (gpuledger.core.queues.queue_book)
and adds each placement as it is made, so one place pass, or admissions in a row, read the books once. Its
`key` is the fair order's (gpuledger.core.queues.fair_share.queue_key, the top-level queue first, then the
leaf): smaller goes first; a queue's key only grows as it places, which lets the line's pass re-check a key
lazily. Its `refusal` is gpuledger.core.queues.quotas.quota_refusal's, in words naming the queue, its use and
its quota.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuledger.core.model import MILLI_PER_GPU, Denial, Placement, Request
from gpuledger.core.queues.fair_share import queue_key
from gpuledger.core.queues.gpu_queues import QueueSet
from gpuledger.core.queues.queue_book import QueueBook
from gpuledger.core.queues.quotas import Capacity, ProductCapacity, Usage, Use, gpus_text, quota_refusal


class QueueGate:
    """The queues' view over a run of decisions: quota refusals and fair-order keys."""

    def __init__(
        self,
        book: QueueBook,
        decide: Callable[[Request], Placement | Denial],
        is_placed_gang: Callable[[str], bool],
    ):
        queues = book.queues
        assert queues is not None
        self.book = book
        self.queues: QueueSet = queues
        self.usage: Usage = book.usage()
        self.capacity: Capacity = book.capacity()
        self.decide = decide
        self.is_placed_gang = is_placed_gang
        self._keys: dict[str, tuple] = {}
        self._gangs: set[str] = set()  # gangs whose use is counted (placed before, or by this gate)

    def queue_of(self, request: Request) -> str:
        return self.book.queue_of(request.namespace) or self.queues.default

    def key(self, request: Request) -> tuple:
        """The fair order's key of the request's queue: smaller goes first."""
        queue = self.queue_of(request)
        known = self._keys.get(queue)
        if known is None:
            queues, usage, capacity = self.queues, self.usage, self.capacity
            known = self._keys[queue] = (
                queue_key(queues, usage, capacity, queues.top(queue)),
                queue_key(queues, usage, capacity, queue),
            )
        return known

    def use_of(self, placement: Placement) -> Use:
        """What a placement would hold: every slot of a gang's plan, else its one node."""
        product = self.book.product
        if placement.group_plan:
            return Use.of(
                (
                    product(s.node),
                    len(s.devices) * MILLI_PER_GPU + sum(x.milli for x in s.shares),
                    placement.cpu_milli,
                    placement.memory_mib,
                )
                for s in placement.group_plan
            )
        milli = len(placement.devices) * MILLI_PER_GPU + sum(x.milli for x in placement.shares)
        return Use.of([(product(placement.node), milli, placement.cpu_milli, placement.memory_mib)])

    def refusal(self, request: Request) -> str | None:
        """None when the request's queue may take what the ledger would give it now (or the ledger would
        give it nothing: it is denied or waits for that reason); else why not, naming the queue, its use and
        its quota. A pod of a gang already placed takes one of its slots, held already: never refused."""
        if request.group is not None and self.is_placed_gang(request.group.key):
            self._gangs.add(request.group.key)
            return None
        decided = self.decide(request)
        if isinstance(decided, Denial):
            return None
        queue = self.queue_of(request)
        refusal = quota_refusal(self.queues, self.usage, self.capacity, queue, self.use_of(decided))
        return None if refusal is None else self.limit_words(queue, refusal)

    def limit_words(self, queue: str, refusal: str) -> str:
        """E.g. "queue team-a is at its limit: 64 of 64 GPUs used (quota 64, may borrow 0): ..."."""
        q = self.queues[queue]
        quota = q.total_gpus
        limits = [e.borrowing_limit for e in q.quotas]
        used = gpus_text(self.usage.total(queue))
        if q.quotas and all(b is not None for b in limits):
            borrow = sum(b for b in limits if b is not None)
            return (
                f"queue {queue} is at its limit: {used} of {quota + borrow} GPUs used "
                f"(quota {quota}, may borrow {borrow}); {refusal}"
            )
        return (
            f"queue {queue} is at its limit: {used} GPUs used (quota {quota}, may borrow what other "
            f"queues do not use); {refusal}"
        )

    def placed(self, request: Request, placement: Placement) -> None:
        """A placement was made: its queue uses it, and its GPUs are no longer free."""
        group = request.group
        if group is not None and group.size > 1:
            if group.key in self._gangs:
                return  # a later pod of a gang: its slot was counted with the gang's first
            self._gangs.add(group.key)
        use = self.use_of(placement)
        self.usage.add(self.queue_of(request), use)
        products = dict(self.capacity.products)
        for product, milli, _, _ in use.parts:
            cap = products.get(product)
            if cap is not None:
                products[product] = ProductCapacity(
                    cap.milli, max(0, cap.free_milli - milli), cap.cpu_milli, cap.memory_mib
                )
        self.capacity = Capacity(products)
        self._keys.clear()
