"""The webhook's placements admitted ahead (gpuledger.webhook.ledger.prefetch), modelled in the trace replay.

What it costs in placement quality: per pod shape, `depth` placements are decided before their pods arrive
(in the actor's order, by the same strategy) and held meanwhile. The replay has no clock, so nothing here
ages out: what a pool holds stays held until a pod of its shape takes it or a denial gives every pool back
(as the webhook does before it asks once more), and a pool is refilled after every placement, where the
webhook tops it up only at its low-water mark. That is the pessimistic end: the webhook holds no more, and
releases what is not taken within `prefetch_max_age_s`.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

from gpuledger.core.ledger import Ledger
from gpuledger.core.model import Denial, Placement, Request


class AheadPools:
    def __init__(self, ledger: Ledger, depth: int):
        self.ledger, self.depth = ledger, depth
        self.pools: dict[tuple, deque[Placement]] = {}
        self.taken = 0  # pods that took a placement decided ahead

    @property
    def held(self) -> int:
        return sum(len(pool) for pool in self.pools.values())

    def place(self, request: Request) -> Placement | Denial:
        shape = request.shape()
        pool = self.pools.get(shape) if shape is not None else None
        if pool:
            self.taken += 1
            result: Placement | Denial = pool.popleft()
        else:
            result = self.ledger.reserve(request, 0.0)
            if not isinstance(result, Placement) and self.held:
                self.release_all()
                result = self.ledger.reserve(request, 0.0)
        if shape is not None and isinstance(result, Placement):
            self._refill(shape, request)
        return result

    def _refill(self, shape: tuple, request: Request) -> None:
        pool = self.pools.setdefault(shape, deque())
        while len(pool) < self.depth:
            ahead = self.ledger.reserve(replace(request, id=f"{request.id}~ahead{len(pool)}"), 0.0)
            if not isinstance(ahead, Placement):
                break  # no room for that shape: the webhook pauses it
            pool.append(ahead)

    def release_all(self) -> None:
        for pool in self.pools.values():
            for placement in pool:
                self.ledger.release(placement.id)
        self.pools.clear()
