"""Posting Events and finding placed pods over aiohttp, on the webhook's own event loop.

The `kubernetes` client costs ~2.3 ms of CPU per Event here (a thread hop, its serializer, urllib3), more than
an admission; one pod create posts one GPUPlaced Event, in the same process and under the same GIL as the
admissions. A kept-alive aiohttp session does the same POST for ~0.3-0.8 ms (docs/benchmarks.md, sessions 6
and 9). The session takes the API server's address, TLS and credentials from the `kubernetes` client's
Configuration (so a kubeconfig and the in-cluster service account work as for the rest of the webhook). The
Authorization header comes from the client's own refresh hook (which re-reads a rotated service-account
token), asked at most every `auth_ttl_s` (the hook re-applies the whole kubeconfig: a third of an Event's CPU
when asked per request) and again at once after a 401.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from allocator.service import RESERVATION_ID_KEY
from webhook.events import METADATA_ONLY, ObjectRef


class ApiEventWriter:
    """`EventWriter` over one aiohttp session (opened on first use, on the running loop; `close` ends it)."""

    def __init__(
        self,
        api_client: Any,
        timeout_s: float = 5.0,
        ids_per_list: int = 100,
        connections: int = 4,
        auth_ttl_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.configuration = api_client.configuration
        self.base = str(self.configuration.host).rstrip("/")
        self._timeout, self._chunk, self._connections = timeout_s, ids_per_list, connections
        self._auth_ttl_s, self._clock = auth_ttl_s, clock
        self._auth: dict[str, str] | None = None
        self._auth_at = 0.0
        self.auth_reads = 0
        self._session: Any = None
        self._ssl: ssl.SSLContext | bool | None = None

    def _tls(self) -> ssl.SSLContext | bool:
        cfg = self.configuration
        if not self.base.startswith("https://"):
            return False
        if not cfg.verify_ssl:
            return False
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

    def _headers(self, content_type: str | None = None, accept: str = "application/json") -> dict[str, str]:
        headers = {"Accept": accept, **self._auth_headers()}
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    async def _open(self) -> Any:
        import aiohttp

        if self._session is None or self._session.closed:
            if self._ssl is None:
                self._ssl = self._tls()
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(ssl=self._ssl, limit=self._connections),
                timeout=aiohttp.ClientTimeout(total=self._timeout),
            )
        return self._session

    async def _request(
        self, method: str, path: str, headers: Callable[[], dict[str, str]], **kwargs: Any
    ) -> bytes:
        session = await self._open()
        server_name = getattr(self.configuration, "tls_server_name", None)
        if server_name:
            kwargs["server_hostname"] = server_name
        if getattr(self.configuration, "proxy", None):  # as the kubernetes client would go
            kwargs["proxy"] = self.configuration.proxy
        for attempt in (1, 2):
            async with session.request(method, self.base + path, headers=headers(), **kwargs) as resp:
                data = await resp.read()
                if resp.status == 401 and attempt == 1:
                    self._auth = None  # a token rotated since it was read: read it again, once
                    continue
                if resp.status >= 300:
                    said = data[:300].decode(errors="replace")
                    raise RuntimeError(f"{method} {path}: HTTP {resp.status}: {said}")
                return data
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def find_pods(self, namespace: str, reservation_ids: list[str]) -> dict[str, ObjectRef]:
        found: dict[str, ObjectRef] = {}
        for i in range(0, len(reservation_ids), self._chunk):
            chunk = reservation_ids[i : i + self._chunk]
            data = await self._request(
                "GET",
                f"/api/v1/namespaces/{quote(namespace, safe='')}/pods",
                params={
                    "labelSelector": f"{RESERVATION_ID_KEY} in ({','.join(chunk)})",
                    # the API server's watch cache, not etcd; a miss is looked at again
                    "resourceVersion": "0",
                },
                headers=lambda: self._headers(accept=METADATA_ONLY),  # names and uids, not whole pods
            )
            for pod in json.loads(data).get("items") or []:
                meta = pod.get("metadata") or {}
                rid = (meta.get("labels") or {}).get(RESERVATION_ID_KEY)
                if rid:
                    found[rid] = ObjectRef("v1", "Pod", namespace, meta.get("name", ""), meta.get("uid", ""))
        return found

    async def create(self, namespace: str, body: dict) -> None:
        await self._request(
            "POST",
            f"/api/v1/namespaces/{quote(namespace, safe='')}/events",
            data=json.dumps(body, separators=(",", ":")),
            headers=lambda: self._headers("application/json"),
        )

    async def close(self) -> None:
        if self._session is not None and not self._session.closed:
            await self._session.close()
            await asyncio.sleep(0)  # let the connector's transports close on this loop
        self._session = None
