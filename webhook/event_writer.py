"""Posting Events and finding placed pods on the webhook's own event loop, over one kept-alive connection to
the API server (webhook.api_http).

The `kubernetes` client costs ~2.3 ms of CPU per Event here (a thread hop, its serializer, urllib3) and an
aiohttp session ~0.8 ms, more than an admission; one pod create posts one GPUPlaced Event, in the same
process and under the same GIL as the admissions. webhook.api_http does the same POST for ~0.33 ms
(docs/benchmarks.md, session 12). The connection takes the API server's address, TLS, proxy and credentials
from the `kubernetes` client's Configuration (so a kubeconfig and the in-cluster service account work as for
the rest of the webhook). The Authorization header comes from the client's own refresh hook (which re-reads a
rotated service-account token), asked at most every `auth_ttl_s` (the hook re-applies the whole kubeconfig:
a third of an Event's CPU when asked per request) and again at once after a 401.
"""

from __future__ import annotations

import ssl
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlencode

import orjson

from allocator.service import RESERVATION_ID_KEY
from webhook.api_http import ApiHttp
from webhook.events import METADATA_ONLY, ObjectRef


class ApiEventWriter:
    """`EventWriter` over one webhook.api_http connection (opened on first use; `close` ends it)."""

    def __init__(
        self,
        api_client: Any,
        timeout_s: float = 5.0,
        ids_per_list: int = 100,
        auth_ttl_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.configuration = api_client.configuration
        self.base = str(self.configuration.host).rstrip("/")
        self._timeout, self._chunk = timeout_s, ids_per_list
        self._auth_ttl_s, self._clock = auth_ttl_s, clock
        self._auth: dict[str, str] | None = None
        self._auth_at = 0.0
        self.auth_reads = 0
        self._http: ApiHttp | None = None

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

    def _headers(self, content_type: str | None = None, accept: str = "application/json") -> dict[str, str]:
        headers = {"Accept": accept, **self._auth_headers()}
        if content_type:
            headers["Content-Type"] = content_type
        return headers

    def _connection(self) -> ApiHttp:
        if self._http is None:
            cfg = self.configuration
            self._http = ApiHttp(
                self.base,
                self._tls(),
                server_hostname=getattr(cfg, "tls_server_name", None) or None,
                proxy=getattr(cfg, "proxy", None) or None,  # as the kubernetes client would go
                proxy_headers=getattr(cfg, "proxy_headers", None) or None,
                timeout_s=self._timeout,
            )
        return self._http

    async def _request(
        self, method: str, path: str, headers: Callable[[], dict[str, str]], body: bytes = b""
    ) -> bytes:
        http = self._connection()
        for attempt in (1, 2):
            status, data = await http.request(method, path, headers(), body)
            if status == 401 and attempt == 1:
                self._auth = None  # a token rotated since it was read: read it again, once
                continue
            if status >= 300:
                said = data[:300].decode(errors="replace")
                raise RuntimeError(f"{method} {path.split('?', 1)[0]}: HTTP {status}: {said}")
            return data
        raise AssertionError("unreachable: the second attempt returns or raises")

    async def find_pods(self, namespace: str, reservation_ids: list[str]) -> dict[str, ObjectRef]:
        found: dict[str, ObjectRef] = {}
        for i in range(0, len(reservation_ids), self._chunk):
            chunk = reservation_ids[i : i + self._chunk]
            query = urlencode(
                {
                    "labelSelector": f"{RESERVATION_ID_KEY} in ({','.join(chunk)})",
                    # the API server's watch cache, not etcd; a miss is looked at again
                    "resourceVersion": "0",
                }
            )
            data = await self._request(
                "GET",
                f"/api/v1/namespaces/{quote(namespace, safe='')}/pods?{query}",
                headers=lambda: self._headers(accept=METADATA_ONLY),  # names and uids, not whole pods
            )
            for pod in orjson.loads(data).get("items") or []:
                meta = pod.get("metadata") or {}
                rid = (meta.get("labels") or {}).get(RESERVATION_ID_KEY)
                if rid:
                    found[rid] = ObjectRef("v1", "Pod", namespace, meta.get("name", ""), meta.get("uid", ""))
        return found

    async def create(self, namespace: str, body: dict) -> None:
        await self._request(
            "POST",
            f"/api/v1/namespaces/{quote(namespace, safe='')}/events",
            headers=lambda: self._headers("application/json"),
            body=orjson.dumps(body),
        )

    async def close(self) -> None:
        if self._http is not None:
            await self._http.close()
        self._http = None
