"""The controller's probe server (gpuledger.controller.health): what /healthz and /readyz answer, phase by
phase, and that /healthz stops answering while the loop that serves it is stuck."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
import urllib.error
import urllib.request

import pytest

from gpuledger.controller.health import Health


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(port: int, path: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_readiness_by_phase():
    clock = Clock()
    api = {"fresh": True}
    health = Health(lambda: api["fresh"], lambda: None, stale_s=20.0, clock=clock)
    assert health.readiness() == (True, "standby, waiting for the Lease")
    api["fresh"] = False
    ready, why = health.readiness()
    assert not ready and "API server" in why
    api["fresh"] = True
    clock.now += 21  # no ledger check answered for longer than stale_s
    ready, why = health.readiness()
    assert not ready and "ledger" in why
    health.leading()  # from the Lease on, whatever kopf does at start-up
    api["fresh"] = False
    assert health.readiness() == (True, "leader, kopf starting")
    health.kopf_running = True
    assert health.readiness() == (True, "leader, kopf running")
    health.stopping()
    assert health.readiness() == (False, "stopping")


class LoopThread:
    """A Health served on an event loop of its own thread, which the test can block."""

    def __init__(self, health: Health, port: int):
        self.loop = asyncio.new_event_loop()
        self.health, self.port = health, port
        started = threading.Event()

        def serve() -> None:
            asyncio.set_event_loop(self.loop)
            self.loop.run_until_complete(health.start("127.0.0.1", port))
            started.set()
            self.loop.run_forever()

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        assert started.wait(10)

    def call(self, fn, *args) -> None:
        self.loop.call_soon_threadsafe(fn, *args)

    def close(self) -> None:
        asyncio.run_coroutine_threadsafe(self.health.close(), self.loop).result(10)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@pytest.fixture
def served():
    servers: list[LoopThread] = []

    def serve(health: Health) -> LoopThread:
        server = LoopThread(health, _free_port())
        servers.append(server)
        return server

    yield serve
    for server in servers:
        server.close()


def test_endpoints_answer_the_phase(served):
    checks = []
    ledger_up = {"up": True}

    def ledger_check():
        checks.append(time.monotonic())
        if not ledger_up["up"]:
            raise ConnectionError("actor gone")

    health = Health(lambda: True, ledger_check, check_every_s=0.05, stale_s=0.3)
    server = served(health)
    assert _get(server.port, "/healthz") == (200, "ok\n")
    assert _get(server.port, "/readyz") == (200, "standby, waiting for the Lease\n")
    # the standby checks the ledger on its own; unanswered for longer than stale_s: not ready
    ledger_up["up"] = False
    deadline = time.monotonic() + 10
    while _get(server.port, "/readyz")[0] != 503:
        assert time.monotonic() < deadline, "never unready with the ledger gone"
        time.sleep(0.05)
    assert "ledger" in _get(server.port, "/readyz")[1]
    assert _get(server.port, "/healthz")[0] == 200  # alive all the same
    ledger_up["up"] = True
    while _get(server.port, "/readyz")[0] != 200:
        assert time.monotonic() < deadline, "never ready again with the ledger back"
        time.sleep(0.05)
    server.call(health.leading)
    deadline = time.monotonic() + 10
    while _get(server.port, "/readyz") != (200, "leader, kopf starting\n"):
        assert time.monotonic() < deadline
        time.sleep(0.05)
    count = len(checks)
    time.sleep(0.3)
    assert len(checks) <= count + 1  # the leader runs no ledger check of its own


def test_healthz_times_out_while_the_loop_is_stuck(served):
    health = Health(lambda: True, lambda: None)
    server = served(health)
    assert _get(server.port, "/healthz")[0] == 200
    release = threading.Event()
    server.call(release.wait, 10)  # a blocking call on the loop: it answers nothing until it returns
    started = time.monotonic()
    with pytest.raises((TimeoutError, urllib.error.URLError)):
        _get(server.port, "/healthz", timeout=1.0)
    assert time.monotonic() - started >= 0.9
    release.set()
    assert _get(server.port, "/healthz")[0] == 200


def test_close_ends_every_connection_at_once(served):
    """At a stop the server goes away with its open connections, so kopf's shutdown waits for none."""
    health = Health(lambda: True, lambda: None)
    server = served(health)
    idle = socket.create_connection(("127.0.0.1", server.port))  # an open, idle keep-alive connection
    idle.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
    assert b"200" in idle.recv(4096)
    started = time.monotonic()
    asyncio.run_coroutine_threadsafe(health.close(), server.loop).result(10)
    assert time.monotonic() - started < 1.0
    idle.settimeout(2)
    assert idle.recv(4096) == b""  # closed by the server
    idle.close()
    with pytest.raises(OSError):
        socket.create_connection(("127.0.0.1", server.port), timeout=1).close()
