"""Running the app over TLS: in the current event loop (`start_server`) or on a thread of its own
(`ServerThread`, for harnesses whose code is synchronous)."""

from __future__ import annotations

import asyncio
import gc
import sys
import threading
from dataclasses import dataclass

from aiohttp import web

from gpuledger.webhook.transport.tls import ReloadingTLS

GIL_SWITCH_INTERVAL_S = 0.0005


def tune_gc() -> None:
    """Move everything allocated at start-up (Ray, aiohttp, the app) out of the collector's sight and collect
    less often: full collections over those objects are what shows up as p99 latency spikes."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 50, 100)
    # the cluster watch and Ray's client run Python threads in this process: a thread busy on the GIL keeps
    # the admission loop waiting up to the switch interval (5 ms by default) for each wake-up
    sys.setswitchinterval(GIL_SWITCH_INTERVAL_S)


@dataclass
class RunningServer:
    runner: web.AppRunner
    site: web.TCPSite
    host: str
    port: int
    tls: ReloadingTLS | None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}:{self.port}"

    async def stop(self) -> None:
        if self.tls is not None:
            await self.tls.stop()
        await self.runner.cleanup()


async def start_server(
    app: web.Application,
    host: str = "127.0.0.1",
    port: int = 0,
    tls: ReloadingTLS | None = None,
    backlog: int = 1024,
) -> RunningServer:
    """Serve `app` (port 0 picks a free port); TLS reloads start polling here."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(
        runner, host, port, ssl_context=tls.context if tls else None, backlog=backlog, reuse_address=True
    )
    await site.start()
    bound = runner.addresses[0][1] if port == 0 else port  # the OS's choice (this runner's one site)
    if tls is not None:
        tls.start()
    return RunningServer(runner, site, host, bound, tls)


class ServerThread:
    """The webhook on its own thread and loop: `start()` returns once it listens; `stop()` ends it.

    `app_factory` runs on the server's loop (aiohttp apps and Ray's asyncio calls belong to one loop).
    """

    def __init__(self, app_factory, host: str = "127.0.0.1", port: int = 0, tls_factory=None):
        self._app_factory, self._tls_factory = app_factory, tls_factory
        self.host, self.port = host, port
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: RunningServer | None = None
        self._ready = threading.Event()
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="gpuledger-webhook", daemon=True)

    def _run(self) -> None:
        self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        try:
            app = self._app_factory()
            tls = self._tls_factory() if self._tls_factory else None
            self.server = self.loop.run_until_complete(start_server(app, self.host, self.port, tls))
            self.port = self.server.port
        except BaseException as exc:  # noqa: BLE001 - reported to start()
            self._error = exc
            self._ready.set()
            return
        self._ready.set()
        self.loop.run_forever()
        self.loop.run_until_complete(self.server.stop())
        self.loop.close()

    def start(self, timeout: float = 30.0) -> ServerThread:
        self._thread.start()
        if not self._ready.wait(timeout):
            raise TimeoutError("webhook server did not start")
        if self._error is not None:
            raise self._error
        return self

    @property
    def url(self) -> str:
        return self.server.url if self.server else ""

    def stop(self, timeout: float = 10.0) -> None:
        if self.loop is not None and self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(timeout)
