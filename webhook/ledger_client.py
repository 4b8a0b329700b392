"""How the webhook talks to the ledger: one interface, an in-process client and a batched Ray client.

The handler calls one admission at a time; batching many concurrent admissions into one actor call is the
Ray client's business (webhook.batcher), invisible to the handler.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Protocol

from allocator.service import (
    AdmitCall,
    Denial,
    Explanation,
    Held,
    LedgerService,
    Placement,
    Request,
    Unavailable,
)
from webhook.batcher import Batcher


class LedgerUnavailable(RuntimeError):
    """The ledger could not answer (actor dead or restarting, Ray down): the fail-open/closed rule applies."""


class LedgerClient(Protocol):
    """`Unavailable` answers mean the ledger cannot decide yet (not synced); errors raise
    LedgerUnavailable."""

    async def admit(self, call: AdmitCall) -> Placement | Denial | Unavailable: ...

    async def lookup(self, reservation_id: str) -> Held | Unavailable | None: ...

    async def claim(self, reservation_id: str) -> Held | Unavailable | None: ...

    async def status(self) -> dict[str, Any]: ...

    async def stats(self) -> Any: ...

    async def explain(self, request: Request) -> Explanation: ...

    async def close(self) -> None: ...


class InProcessLedgerClient:
    """Wraps a LedgerService in this process: handler tests and `explain`. `clock` gives the ledger's
    `now`."""

    def __init__(self, service: LedgerService, clock: Callable[[], float] = time.time):
        self.service, self.clock = service, clock

    async def admit(self, call: AdmitCall) -> Placement | Denial | Unavailable:
        return self.service.admit([call], self.clock())[0]

    async def lookup(self, reservation_id: str) -> Held | Unavailable | None:
        return self.service.lookup([reservation_id])[0]

    async def claim(self, reservation_id: str) -> Held | Unavailable | None:
        return self.service.claim([reservation_id])[0]

    async def status(self) -> dict[str, Any]:
        return self.service.status()

    async def stats(self) -> Any:
        return self.service.stats()

    async def explain(self, request: Request) -> Explanation:
        return self.service.explain(request)

    async def close(self) -> None:
        return None


class RayLedgerClient:
    """The shared ledger actor, with concurrent admissions (and lookups) coalesced into one call each.

    A failed call is retried while the actor restarts: reservations are keyed by id, so a retry of an
    admission that did reach the old actor returns the same placement. The handler's deadline bounds it.
    """

    def __init__(
        self, handle: Any, max_batch: int = 1024, max_in_flight: int = 1, retry_backoff_s: float = 0.05
    ):
        self.handle = handle
        self.retry_backoff_s = retry_backoff_s
        self.admissions: Batcher[AdmitCall, Placement | Denial | Unavailable] = Batcher(
            lambda calls: self._call("admit", calls), max_batch, max_in_flight
        )
        self.lookups: Batcher[str, Held | Unavailable | None] = Batcher(
            lambda ids: self._call("lookup", ids), max_batch, max_in_flight
        )
        self.claims: Batcher[str, Held | Unavailable | None] = Batcher(
            lambda ids: self._call("claim", ids), max_batch, max_in_flight
        )

    async def _call(self, method: str, *args: Any) -> Any:
        import ray.exceptions as rex

        retriable = (rex.RayActorError, rex.ActorUnavailableError, rex.ActorDiedError)
        delay = self.retry_backoff_s
        while True:
            try:
                return await getattr(self.handle, method).remote(*args)
            except retriable:
                # keep trying until the caller's deadline cancels us; the actor restarts (max_restarts=-1)
                pass
            except rex.RaySystemError as exc:
                raise LedgerUnavailable(f"ray: {exc}") from exc
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def admit(self, call: AdmitCall) -> Placement | Denial | Unavailable:
        return await self.admissions.submit(call)

    async def lookup(self, reservation_id: str) -> Held | Unavailable | None:
        return await self.lookups.submit(reservation_id)

    async def claim(self, reservation_id: str) -> Held | Unavailable | None:
        return await self.claims.submit(reservation_id)

    async def status(self) -> dict[str, Any]:
        return await self._call("status")

    async def stats(self) -> Any:
        return await self._call("stats")

    async def explain(self, request: Request) -> Explanation:
        return await self._call("explain", request)

    async def close(self) -> None:
        return None
