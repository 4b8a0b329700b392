"""Coalesce concurrent calls into one: a Ray actor call costs ~1.2 ms whatever it carries.

When no call is in flight, the items submitted in the same turn of the event loop leave together at the end
of it (the requests one socket read delivered, or a prefetch asking for several placements at once: one
call, not one each; no wait beyond the turn). Items that arrive while a call is in flight wait and leave
together as the next call the moment it returns. So a batch is what accumulated during one round trip, and
the rate of calls stays at most 1/RTT however many admissions are in flight.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import Generic, TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

# how many items left in the same call as the caller's last one (set in the caller's context: the admission
# log)
batch_size: ContextVar[int] = ContextVar("batch_size", default=0)


class Batcher(Generic[Item, Result]):
    def __init__(
        self,
        send: Callable[[list[Item]], Awaitable[list[Result]]],
        max_batch: int = 1024,
        max_in_flight: int = 1,
    ):
        self._send = send
        self._max_batch = max_batch
        self._max_in_flight = max_in_flight
        self._queue: list[tuple[Item, asyncio.Future]] = []
        self._in_flight = 0
        self._launch_due = False  # a launch is scheduled for the end of this turn of the loop
        self.calls = 0
        self.items = 0

    async def submit(self, item: Item) -> Result:
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._in_flight < self._max_in_flight and not self._launch_due:
            self._launch_due = True
            asyncio.get_running_loop().call_soon(self._launch_now)
        result, size = await future
        batch_size.set(size)
        return result

    def _launch_now(self) -> None:
        self._launch_due = False
        self._launch_waiting()

    def _launch_waiting(self) -> None:
        while self._queue and self._in_flight < self._max_in_flight:
            self._launch()

    def _launch(self) -> None:
        # items whose caller gave up (deadline) are not sent
        self._queue = [(item, fut) for item, fut in self._queue if not fut.done()]
        batch, self._queue = self._queue[: self._max_batch], self._queue[self._max_batch :]
        if not batch:
            return
        self._in_flight += 1
        self.calls += 1
        self.items += len(batch)
        asyncio.get_running_loop().create_task(self._run(batch))

    async def _run(self, batch: list[tuple[Item, asyncio.Future]]) -> None:
        try:
            results = await self._send([item for item, _ in batch])
            if len(results) != len(batch):
                raise RuntimeError(f"batched call answered {len(results)} results for {len(batch)} items")
        except BaseException as exc:  # every waiter must learn of the failure
            for _, fut in batch:
                if not fut.done():
                    fut.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
            if not isinstance(exc, Exception):
                raise
        else:
            for (_, fut), result in zip(batch, results, strict=True):
                if not fut.done():
                    fut.set_result((result, len(batch)))
        finally:
            self._in_flight -= 1
            self._launch_waiting()

    @property
    def mean_batch(self) -> float:
        return self.items / self.calls if self.calls else 0.0
