"""The controller's probes: `/healthz` and `/readyz`, from an aiohttp server on the controller's own loop.

One server for the whole life of the process, on the asyncio loop that runs the Lease wait, the reconcile
engine and kopf's watches: it answers only while that loop turns, so a stuck loop (a blocking call, a
deadlock, a frozen process) times the liveness probe out, whether the replica is a standby or the leader.
kopf's own liveness endpoint answers from the same loop too, but only once kopf runs: a standby runs no kopf.

- `/healthz` (liveness, startup): 200 whenever the loop answers.
- `/readyz` (readiness): 200 for the leader from the moment it holds the Lease (kopf's start-up included),
  and for a standby whose last Lease read reached the API server and whose last ledger check answered, both
  recently; 503 (with the reason) otherwise, and once the controller is stopping.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

log = logging.getLogger("gpuledger.controller.health")

STANDBY, LEADER, STOPPING = "standby", "leader", "stopping"


class Health:
    """What the probes answer, from the phase the controller is in and the standby's two checks.

    `api_fresh()`: did this replica reach the API server recently (its Lease reads); `ledger_check()`: a
    blocking call that raises unless the ledger actor answers, run in a thread every `check_every_s` while
    this replica is a standby (the leader's engine asks the ledger on every pass and says so in its status).
    """

    def __init__(
        self,
        api_fresh: Callable[[], bool],
        ledger_check: Callable[[], Any],
        *,
        check_every_s: float = 5.0,
        check_timeout_s: float = 3.0,
        stale_s: float = 20.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.api_fresh, self.ledger_check = api_fresh, ledger_check
        self.check_every_s, self.check_timeout_s, self.stale_s = check_every_s, check_timeout_s, stale_s
        self.clock = clock
        self.phase = STANDBY
        self.kopf_running = False
        self.ledger_ok_at: float | None = clock()  # the handle was just found: the actor answered
        self._checker: asyncio.Task | None = None
        self._runner: Any = None

    # ------------------------------------------------------------------ state
    def readiness(self) -> tuple[bool, str]:
        if self.phase == STOPPING:
            return False, "stopping"
        if self.phase == LEADER:
            return True, "leader, kopf running" if self.kopf_running else "leader, kopf starting"
        if not self.api_fresh():
            return False, "standby: no recent answer from the API server to the Lease reads"
        if self.ledger_ok_at is None or self.clock() - self.ledger_ok_at > self.stale_s:
            return False, "standby: the ledger actor did not answer recently"
        return True, "standby, waiting for the Lease"

    def leading(self) -> None:
        """This replica holds the Lease: ready from now on, kopf's start-up included."""
        self.phase = LEADER
        if self._checker is not None:
            self._checker.cancel()

    def stopping(self) -> None:
        self.phase = STOPPING
        if self._checker is not None:
            self._checker.cancel()

    async def _check_ledger(self) -> None:
        while self.phase == STANDBY:
            try:
                await asyncio.wait_for(asyncio.to_thread(self.ledger_check), self.check_timeout_s)
            except asyncio.CancelledError:
                raise
            except Exception as err:  # noqa: BLE001 - any failure is "the ledger did not answer"
                log.warning("ledger check: %s", str(err) or type(err).__name__)
            else:
                self.ledger_ok_at = self.clock()
            await asyncio.sleep(self.check_every_s)

    # ------------------------------------------------------------------ server
    async def start(self, host: str, port: int) -> None:
        from aiohttp import web

        async def healthz(_: web.Request) -> web.Response:
            return web.Response(text="ok\n")

        async def readyz(_: web.Request) -> web.Response:
            ready, why = self.readiness()
            return web.Response(status=200 if ready else 503, text=why + "\n")

        app = web.Application()
        app.router.add_get("/healthz", healthz)
        app.router.add_get("/readyz", readyz)
        # shutdown_timeout: the handlers answer at once; an open connection must not hold the exit
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await self._runner.setup()
        await web.TCPSite(self._runner, host, port).start()
        if self.phase == STANDBY:
            self._checker = asyncio.create_task(self._check_ledger(), name="ledger check")

    async def close(self) -> None:
        """Stop answering (the process is stopping) and close every connection, so none outlives the loop."""
        self.stopping()
        if self._checker is not None:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._checker
        runner, self._runner = self._runner, None
        if runner is not None:
            await runner.cleanup()
