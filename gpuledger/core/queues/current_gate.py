"""The queues' gate as of the books' latest change: one `QueueGate` (gpuledger.core.queues.queue_gate) kept
across the ledger's decisions while nothing changed but what the gate counted itself.

A gate reads each queue's use and the capacity from the books when it is made, so making one per decision
would read them per decision. It is made again only once the books changed otherwise: a node added, removed
or changed (the index's touched log), a namespace's queue or a GPUQueue changed (the queue book's version),
or a reservation made or freed; a placement the gate counted itself (`kept`) leaves it good.
"""

from __future__ import annotations

from collections.abc import Callable

from gpuledger.core.books.books import Books
from gpuledger.core.model import Denial, Placement, Request
from gpuledger.core.queues.queue_book import QueueBook
from gpuledger.core.queues.queue_gate import QueueGate


class CurrentGate:
    """The ledger's queue gate, made again only when the books changed other than by its own placements."""

    def __init__(self, books: Books, queues: QueueBook, decide: Callable[[Request], Placement | Denial]):
        self._books = books
        self._queues = queues
        self._decide = decide  # the decision the ledger would make for a request now (a dry run's)
        self._at: tuple[int, int, int] | None = None  # the books' stamp the gate was made or kept at
        self._gate: QueueGate | None = None

    def get(self) -> QueueGate | None:
        """The queues' gate (quotas, fair order), None while no GPUQueue exists."""
        book = self._queues
        if book.queues is None:
            return None
        at = self._stamp()
        if self._gate is None or self._at != at:
            self._gate = QueueGate(book, self._decide, self._books.groups.__contains__)
            self._at = at
        return self._gate

    def kept(self, gate: QueueGate | None) -> None:
        """The gate counted every change made since it was read: it stays good."""
        if gate is not None and gate is self._gate:
            self._at = self._stamp()

    def _stamp(self) -> tuple[int, int, int]:
        index = self._books.index
        return (index.touched_base + len(index.touched), self._queues.version, len(self._books.reservations))
