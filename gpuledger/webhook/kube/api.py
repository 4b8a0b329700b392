"""The webhook's own requests to the API server (its Events, the placed pods' look-up, the pods' owners) on
its event loop, over gpuledger.webhook.kube.http connections, as the identity the `kubernetes` client is
configured with.

The address, TLS, proxy and credentials come from the client's Configuration, so a kubeconfig and the
in-cluster service account work as for the rest of the webhook. The Authorization header comes from the
client's own refresh hook (which re-reads a rotated service-account token), asked at most every `auth_ttl_s`
(the hook re-applies the whole kubeconfig: a third of an Event's CPU when asked per request) and again at once
after a 401, when the request is sent once more. A read through the `kubernetes` client costs a thread hop,
its urllib3 pool and several times the CPU of the same GET here (tests/benchmarks/bench_api_requests.py;
docs/benchmarks.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import time
from collections.abc import Callable
from typing import Any

from gpuledger.webhook.kube.http import ApiHttp


class KubeApi:
    """`call` over up to `connections` kept-alive connections (each opened on its first request, the last used
    first)."""

    def __init__(
        self,
        api_client: Any,
        connections: int = 1,
        timeout_s: float = 5.0,
        auth_ttl_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if connections < 1:
            raise ValueError(f"connections={connections!r}: expected at least 1")
        self.configuration = api_client.configuration
        self.base = str(self.configuration.host).rstrip("/")
        self._auth_ttl_s, self._clock = auth_ttl_s, clock
        self._auth: dict[str, str] | None = None
        self._auth_at = 0.0
        self.auth_reads = 0
        cfg = self.configuration
        tls = self._tls()  # at start-up, not on the first admission reading an owner: a bad CA fails here
        self._all = [
            ApiHttp(  # each connects on its first request
                self.base,
                tls,
                server_hostname=getattr(cfg, "tls_server_name", None) or None,
                proxy=getattr(cfg, "proxy", None) or None,  # as the kubernetes client would go
                proxy_headers=getattr(cfg, "proxy_headers", None) or None,
                timeout_s=timeout_s,
            )
            for _ in range(connections)
        ]
        self._idle: asyncio.LifoQueue[ApiHttp] = asyncio.LifoQueue()
        for http in self._all:
            self._idle.put_nowait(http)

    def _tls(self) -> ssl.SSLContext | None:
        cfg = self.configuration
        if not self.base.startswith("https://"):
            return None
        if not cfg.verify_ssl:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            context = ssl.create_default_context(cafile=cfg.ssl_ca_cert or None)
        if cfg.cert_file:
            context.load_cert_chain(cfg.cert_file, cfg.key_file or None)
        return context

    def _auth_headers(self) -> dict[str, str]:
        now = self._clock()
        if self._auth is None or now - self._auth_at >= self._auth_ttl_s:
            self.auth_reads += 1
            auth = {}
            for setting in self.configuration.auth_settings().values():  # runs the client's refresh hook
                if setting.get("in") == "header" and setting.get("value"):
                    auth[setting["key"]] = setting["value"]
            self._auth, self._auth_at = auth, now
        return self._auth

    @property
    def opened(self) -> int:
        """Connections made so far (tests read it)."""
        return sum(http.opened for http in self._all)

    async def call(
        self,
        method: str,
        path: str,
        accept: str = "application/json",
        body: bytes = b"",
        content_type: str | None = None,
    ) -> tuple[int, bytes]:
        """(status, body) of one request; ApiHttpError (gpuledger.webhook.kube.http) or TimeoutError when
        none came
        back."""
        idle = self._idle
        http = await idle.get()
        try:
            for attempt in (1, 2):
                headers = {"Accept": accept, **self._auth_headers()}
                if content_type:
                    headers["Content-Type"] = content_type
                status, data = await http.request(method, path, headers, body)
                if status == 401 and attempt == 1:
                    self._auth = None  # a token rotated since it was read: read it again, once
                    continue
                return status, data
            raise AssertionError("unreachable: the second attempt returns")
        finally:
            idle.put_nowait(http)

    async def close(self) -> None:
        for http in self._all:  # each opens again on its next request
            with contextlib.suppress(Exception):
                await http.close()
