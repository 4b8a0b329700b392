"""How the webhook talks to the ledger: one interface, an in-process client and a batched Ray client.

The handler calls one admission at a time; batching many concurrent admissions into one actor call is the
Ray client's business (gpuledger.webhook.ledger.batcher), invisible to the handler.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol

from gpuledger.core.model import Denial, Explanation, Placement, Request
from gpuledger.core.queues.waiting import Waiting
from gpuledger.ray.channel import CHANNEL_METHODS, CHANNEL_MODES, ChannelError, check_reachable
from gpuledger.service.ledger_service import AdmitCall, Held, LedgerService, Unavailable
from gpuledger.webhook.ledger.batcher import Batcher
from gpuledger.webhook.ledger.channel import LedgerChannel

log = logging.getLogger("gpuledger.ledger_client")


class LedgerUnavailable(RuntimeError):
    """The ledger could not answer (actor dead or restarting, Ray down): the fail-open/closed rule applies."""


class LedgerClient(Protocol):
    """`Unavailable` answers mean the ledger cannot decide yet (not synced); errors raise
    LedgerUnavailable."""

    async def admit(self, call: AdmitCall) -> Placement | Denial | Waiting | Unavailable: ...

    async def lookup(self, reservation_id: str) -> Held | Unavailable | None: ...

    async def claim(self, reservation_id: str, claimer: str = "") -> Held | Unavailable | None: ...

    async def release(self, reservation_ids: list[str]) -> list[bool]: ...

    async def status(self) -> dict[str, Any]: ...

    async def stats(self) -> Any: ...

    async def explain(self, request: Request) -> Explanation: ...

    async def close(self) -> None: ...


class InProcessLedgerClient:
    """Wraps a LedgerService in this process: handler tests and `explain`. `clock` gives the ledger's
    `now`."""

    def __init__(self, service: LedgerService, clock: Callable[[], float] = time.time):
        self.service, self.clock = service, clock
        self.transport_calls = {"in-process": 0}

    async def admit(self, call: AdmitCall) -> Placement | Denial | Waiting | Unavailable:
        self.transport_calls["in-process"] += 1
        return self.service.admit([call], self.clock())[0]

    async def lookup(self, reservation_id: str) -> Held | Unavailable | None:
        self.transport_calls["in-process"] += 1
        return self.service.lookup([reservation_id])[0]

    async def claim(self, reservation_id: str, claimer: str = "") -> Held | Unavailable | None:
        self.transport_calls["in-process"] += 1
        return self.service.claim([(reservation_id, claimer)])[0]

    async def release(self, reservation_ids: list[str]) -> list[bool]:
        self.transport_calls["in-process"] += 1
        return self.service.release(reservation_ids)

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

    The critical-path calls (admit, lookup, claim) go over the direct channel (gpuledger.ray.channel)
    when `channel` allows it and the actor is reachable so; otherwise, and whenever the channel fails, over
    Ray. A failed call is retried while the actor restarts: reservations are keyed by id and claims by the
    admission's uid, so a retry of a call that did reach the actor returns the same answer. The handler's
    deadline bounds it.
    """

    def __init__(
        self,
        handle: Any,
        max_batch: int = 1024,
        max_in_flight: int = 1,
        retry_backoff_s: float = 0.05,
        channel: str = "auto",
        channel_retry_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if channel not in CHANNEL_MODES:
            raise ValueError(f"ledger_channel={channel!r}: expected one of {', '.join(CHANNEL_MODES)}")
        self.handle = handle
        self.retry_backoff_s = retry_backoff_s
        self.channel_mode, self.channel_retry_s, self.clock = channel, channel_retry_s, clock
        self.channel: LedgerChannel | None = None
        self.channel_failed_at: float | None = None
        self.transport_calls = {"channel": 0, "ray": 0}  # every call, by the way it went (/metrics)
        self._opening = asyncio.Lock()
        self.admissions: Batcher[AdmitCall, Placement | Denial | Waiting | Unavailable] = Batcher(
            lambda calls: self._call("admit", calls), max_batch, max_in_flight
        )
        self.lookups: Batcher[str, Held | Unavailable | None] = Batcher(
            lambda ids: self._call("lookup", ids), max_batch, max_in_flight
        )
        self.claims: Batcher[tuple[str, str], Held | Unavailable | None] = Batcher(
            lambda items: self._call("claim", items), max_batch, max_in_flight
        )

    async def _call(self, method: str, *args: Any) -> Any:
        if method in CHANNEL_METHODS and self.channel_mode != "off":
            channel = await self._channel()
            if channel is not None:
                try:
                    answer = await channel.call(method, *args)
                    self.transport_calls["channel"] += 1
                    return answer
                except ChannelError as exc:
                    self._channel_down(channel, exc)
        return await self._ray_call(method, *args)

    @property
    def channel_calls(self) -> int:
        return self.transport_calls["channel"]

    async def _channel(self) -> LedgerChannel | None:
        """The open channel, or a new one; None while it is unusable (retried every channel_retry_s)."""
        if self.channel is not None and not self.channel.closed:
            return self.channel
        failed_at = self.channel_failed_at
        if failed_at is not None and self.clock() - failed_at < self.channel_retry_s:
            return None
        async with self._opening:
            if self.channel is not None and not self.channel.closed:
                return self.channel
            try:
                here = _own_ray_node()
                info = await self.handle.open_channel.remote(self.channel_mode, here)
                check_reachable(self.channel_mode, info, here)
                self.channel = await LedgerChannel.connect(info)
            except Exception as exc:  # noqa: BLE001 - any failure: Ray calls until the next try
                self._channel_down(None, exc)
                return None
            self.channel_failed_at = None
            log.info("ledger channel open to %s:%s", info["host"], info["port"])
            return self.channel

    def _channel_down(self, channel: LedgerChannel | None, exc: BaseException) -> None:
        if self.channel_failed_at is None:
            log.warning("ledger channel unusable, using Ray calls: %s", exc)
        self.channel_failed_at = self.clock()
        if channel is not None and channel is self.channel:
            self.channel = None

    async def _ray_call(self, method: str, *args: Any) -> Any:
        import ray.exceptions as rex

        retriable = (rex.RayActorError, rex.ActorUnavailableError, rex.ActorDiedError)
        delay = self.retry_backoff_s
        self.transport_calls["ray"] += 1
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

    async def admit(self, call: AdmitCall) -> Placement | Denial | Waiting | Unavailable:
        return await self.admissions.submit(call)

    async def lookup(self, reservation_id: str) -> Held | Unavailable | None:
        return await self.lookups.submit(reservation_id)

    async def claim(self, reservation_id: str, claimer: str = "") -> Held | Unavailable | None:
        return await self.claims.submit((reservation_id, claimer))

    async def release(self, reservation_ids: list[str]) -> list[bool]:
        """Placements admitted ahead and never taken (gpuledger.webhook.ledger.prefetch): one call, not on a
        pod's path."""
        return await self._call("release", list(reservation_ids))

    async def status(self) -> dict[str, Any]:
        return await self._ray_call("status")

    async def stats(self) -> Any:
        return await self._ray_call("stats")

    async def explain(self, request: Request) -> Explanation:
        return await self._ray_call("explain", request)

    async def close(self) -> None:
        if self.channel is not None:
            await self.channel.close()
            self.channel = None


def _own_ray_node() -> str:
    import ray

    return ray.get_runtime_context().get_node_id()
