"""Placements admitted ahead: the common pod is placed without a ledger round trip on its critical path.

Pods come in runs of one shape (a Deployment's replicas, a Job's pods, a notebook per user): once the webhook
has admitted a shape, it asks the ledger actor, off the request path, for `depth` more reservations of that
shape and keeps their placements for `max_age_s`, and tops the pool up again, in one call, once it is down to
about half. The next pod of that shape takes one instead of waiting for an `admit` round trip. Each is an
ordinary reservation in the actor, made by the actor's own strategy in its own order, so the actor stays the
only owner of truth and nothing else changes: the validating webhook's claim (exactly one pod per
reservation), the TTL expiry of reservations no stored pod confirms, the rebuild from stored pods. A placement
not taken within `max_age_s` is released, so a burst's leftovers hold their devices for a second, not for the
reservation TTL.

What is never prefetched: gangs and pinned pods (`request.group` / `request.pinned`: the actor plans those
together), dry runs and reinvocations (the handler asks the actor), and a shape the ledger just denied (it
is full for that shape: no more is held back for a while). When this replica's own admission is denied, it
releases everything it holds and asks once more, so a pool never turns a placement the ledger had room for
into a denial. The pools of other replicas can hold at most `depth` placements per shape each, for at most
`max_age_s`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from gpuledger.core.model import Denial, Placement, Request
from gpuledger.core.pods.request import for_another_pod
from gpuledger.service.ledger_service import AdmitCall
from gpuledger.webhook.ledger.client import LedgerClient

log = logging.getLogger("gpuledger.prefetch")


@dataclass(frozen=True)
class PrefetchSettings:
    depth: int = 0  # placements kept ahead per shape; 0 = off
    max_age_s: float = 1.0  # a placement not taken by then is released
    denied_pause_s: float = 5.0  # after the ledger denies a shape, it is not prefetched for this long

    @property
    def low_water(self) -> int:
        """A pool is topped up once it holds this many or fewer: (depth - 1) // 2, so 0 at depths 1 and 2."""
        return (self.depth - 1) // 2

    def __post_init__(self) -> None:
        if type(self.depth) is not int or not 0 <= self.depth <= 64:  # (a bool is not a depth)
            raise ValueError(f"prefetch_depth={self.depth!r}: expected an integer from 0 (off) to 64")
        if type(self.max_age_s) not in (int, float) or not self.max_age_s > 0:
            raise ValueError(f"prefetch_max_age_s={self.max_age_s!r}: expected a positive number of seconds")


@dataclass(frozen=True)
class _Ahead:
    placement: Placement
    use_by: float  # clock(): counted from when it was asked for, so never later than the actor's own age


class PlacementPrefetch:
    def __init__(
        self,
        ledger: LedgerClient,
        settings: PrefetchSettings,
        new_id: Callable[[], str],
        clock: Callable[[], float] = time.monotonic,
        on_outcome: Callable[[str, int], None] = lambda outcome, n: None,
    ):
        self.ledger, self.settings, self.new_id, self.clock = ledger, settings, new_id, clock
        self.on_outcome = on_outcome  # (hit | miss | released | denied, count): the metric
        self.pools: dict[tuple, deque[_Ahead]] = {}
        self.paused_until: dict[tuple, float] = {}
        self.filling: dict[tuple, asyncio.Task] = {}
        self._releases: set[asyncio.Task] = set()
        self._sweeper: asyncio.Task | None = None

    @property
    def held(self) -> int:
        return sum(len(pool) for pool in self.pools.values())

    def take(self, request: Request) -> Placement | None:
        """A placement admitted ahead for `request`'s shape, now this pod's; None when there is none (the
        caller admits as usual). Either way the shape's pool is topped up in the background."""
        shape = request.shape()
        if shape is None or not self.settings.depth:
            return None
        pool = self.pools.get(shape)
        now = self.clock()
        taken = None
        if pool:
            self._drop_stale(pool, now)
            if pool:
                taken = pool.popleft().placement
        self.on_outcome("hit" if taken is not None else "miss", 1)
        self._refill(shape, request, now)
        return taken

    def _drop_stale(self, pool: deque[_Ahead], now: float) -> None:
        stale = []
        while pool and pool[0].use_by <= now:
            stale.append(pool.popleft().placement.id)
        if stale:
            self._release(stale)

    def _refill(self, shape: tuple, request: Request, now: float) -> None:
        """Top the pool up to `depth` once it is down to `low_water`: at depth 2, two placements every other
        pod in one ledger call (gpuledger.webhook.ledger.batcher) rather than one placement in a call of its
        own per pod."""
        if shape in self.filling or self.paused_until.get(shape, float("-inf")) > now:
            return
        held = len(self.pools.get(shape, ()))
        if held <= self.settings.low_water:  # (low_water < depth: there is always something to ask for)
            task = asyncio.get_running_loop().create_task(
                self._fill(shape, request, self.settings.depth - held)
            )
            self.filling[shape] = task

    async def _fill(self, shape: tuple, request: Request, need: int) -> None:
        asked = self.clock()
        use_by = asked + self.settings.max_age_s
        try:
            ids = [self.new_id() for _ in range(need)]
            requests = [for_another_pod(request, rid, "") for rid in ids]  # (a shape is never pinned)
            answers = await asyncio.gather(
                *(self.ledger.admit(AdmitCall(r, False, None)) for r in requests), return_exceptions=True
            )
            pool = self.pools.setdefault(shape, deque())
            for answer in answers:
                if isinstance(answer, Placement):
                    pool.append(_Ahead(answer, use_by))
                elif isinstance(answer, Denial):
                    self.paused_until[shape] = self.clock() + self.settings.denied_pause_s
                    self.on_outcome("denied", 1)
                else:  # Unavailable or an error: the actor is restarting or unreachable
                    self.forget()
                    return
            if not pool:
                self.pools.pop(shape, None)
        except Exception:  # a prefetch is an optimisation: never an admission's failure
            log.exception("prefetching placements failed")
        finally:
            self.filling.pop(shape, None)

    def sweep(self) -> None:
        """Release what was not taken in time (`start` runs this every max_age_s / 2)."""
        now = self.clock()
        for shape, pool in list(self.pools.items()):
            self._drop_stale(pool, now)
            if not pool:
                del self.pools[shape]
        for shape, until in list(self.paused_until.items()):
            if until <= now:
                del self.paused_until[shape]

    def forget(self) -> None:
        """Drop every held placement without releasing it: the actor that made them is gone or restarting
        (what it still holds expires after the reservation TTL)."""
        self.pools.clear()

    async def release_all(self) -> int:
        """Give every held placement back now (this replica was denied, or it stops); returns how many.
        Fills in flight are awaited, not cancelled: a cancelled call could still reserve, unseen."""
        await asyncio.gather(*self.filling.values(), return_exceptions=True)
        ids = [ahead.placement.id for pool in self.pools.values() for ahead in pool]
        self.pools.clear()
        if ids:
            await self._released(ids)
        await asyncio.gather(*self._releases, return_exceptions=True)
        return len(ids)

    def _release(self, ids: list[str]) -> None:
        task = asyncio.get_running_loop().create_task(self._released(ids))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)

    async def _released(self, ids: list[str]) -> None:
        try:
            await self.ledger.release(ids)
            self.on_outcome("released", len(ids))
        except Exception as exc:  # noqa: BLE001 - unreleased, they expire after the reservation TTL
            log.warning("could not release %d prefetched placements (they expire instead): %s", len(ids), exc)

    def start(self) -> None:
        """Sweep on the running loop every max_age_s / 2 (the app starts it; `take` sweeps its own shape)."""
        if self._sweeper is None:
            self._sweeper = asyncio.get_running_loop().create_task(self._sweep_loop())

    async def stop(self) -> None:
        if self._sweeper is not None:
            self._sweeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._sweeper
            self._sweeper = None
        await self.release_all()

    async def _sweep_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.max_age_s / 2)
            self.sweep()

    def __repr__(self) -> str:
        return f"PlacementPrefetch(depth={self.settings.depth}, held={self.held})"
