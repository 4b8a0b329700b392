"""Posting Events and finding placed pods on the webhook's own event loop, over one kept-alive connection to
the API server (gpuledger.webhook.kube.api, gpuledger.webhook.kube.http).

The `kubernetes` client (a thread hop, its serializer, urllib3) and an aiohttp session each spend more CPU per
Event than an admission costs, and one pod create posts one GPUPlaced Event, in the same process and under the
same GIL as the admissions. The connection here does the same POST for a fraction of that
(tests/benchmarks/bench_api_requests.py; docs/benchmarks.md). The poster is one task, so one connection serves
it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlencode

import orjson

from gpuledger.names import RESERVATION_ID_KEY
from gpuledger.webhook.kube.api import KubeApi
from gpuledger.webhook.kube.events import METADATA_ONLY, ObjectRef


class ApiEventWriter:
    """`EventWriter` over one kept-alive connection (opened on first use; `close` ends it)."""

    def __init__(
        self,
        api_client: Any,
        timeout_s: float = 5.0,
        ids_per_list: int = 100,
        auth_ttl_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.api = KubeApi(api_client, 1, timeout_s, auth_ttl_s, clock)
        self._chunk = ids_per_list

    async def _request(
        self, method: str, path: str, accept: str = "application/json", body: bytes = b""
    ) -> bytes:
        status, data = await self.api.call(
            method, path, accept, body, content_type="application/json" if body else None
        )
        if status >= 300:
            said = data[:300].decode(errors="replace")
            raise RuntimeError(f"{method} {path.split('?', 1)[0]}: HTTP {status}: {said}")
        return data

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
                accept=METADATA_ONLY,  # names and uids, not whole pods
            )
            for pod in orjson.loads(data).get("items") or []:
                meta = pod.get("metadata") or {}
                rid = (meta.get("labels") or {}).get(RESERVATION_ID_KEY)
                if rid:
                    found[rid] = ObjectRef("v1", "Pod", namespace, meta.get("name", ""), meta.get("uid", ""))
        return found

    async def create(self, namespace: str, body: dict) -> None:
        await self._request(
            "POST", f"/api/v1/namespaces/{quote(namespace, safe='')}/events", body=orjson.dumps(body)
        )

    async def close(self) -> None:
        await self.api.close()
