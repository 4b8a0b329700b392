"""Where a pod's owning Job or StatefulSet comes from: the API server (serve) or the input files (explain).

Users write the gang's annotations on the Job, so the webhook reads the owner. The lookup is an interface so
the handler never knows whether it talks to the API or to a list of objects.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Iterable, Protocol

OWNER_KINDS = ("Job", "StatefulSet")


class OwnerLookupError(RuntimeError):
    """The owner could not be read (API unreachable, forbidden...): the admission treats it as unavailable."""


class OwnerLookup(Protocol):
    async def get(self, kind: str, namespace: str, name: str) -> dict | None:
        """The owner object as a plain dict, None if it does not exist."""
        ...


class NoOwners:
    async def get(self, kind: str, namespace: str, name: str) -> dict | None:
        return None


class StaticOwners:
    """Owners taken from a list of objects (the pod file and the cluster file of `explain`)."""

    def __init__(self, objects: Iterable[dict] = ()):
        self._by_key: dict[tuple[str, str, str], dict] = {}
        for obj in objects:
            self.add(obj)

    def add(self, obj: dict) -> None:
        if isinstance(obj, dict) and obj.get("kind") in OWNER_KINDS:
            meta = obj.get("metadata") or {}
            self._by_key[(obj["kind"], meta.get("namespace") or "default", meta.get("name", ""))] = obj

    async def get(self, kind: str, namespace: str, name: str) -> dict | None:
        return self._by_key.get((kind, namespace or "default", name))


class KubeOwners:
    """Reads Jobs and StatefulSets through the `kubernetes` client, briefly cached.

    A Job's pods arrive in a burst (parallelism N), so one read serves the whole burst; the cache keeps
    misses too, for a shorter time.
    """

    def __init__(self, api_client: Any, ttl_s: float = 5.0, timeout_s: float = 2.0):
        from kubernetes import client  # the adapter's dependency, not the handler's

        self._batch = client.BatchV1Api(api_client)
        self._apps = client.AppsV1Api(api_client)
        self._ttl, self._timeout = ttl_s, timeout_s
        self._cache: dict[tuple[str, str, str], tuple[float, dict | None]] = {}
        self._inflight: dict[tuple[str, str, str], asyncio.Future] = {}

    def _read(self, kind: str, namespace: str, name: str) -> dict | None:
        from kubernetes.client.exceptions import ApiException

        try:
            if kind == "Job":
                resp = self._batch.read_namespaced_job(name, namespace, _preload_content=False,
                                                       _request_timeout=self._timeout)
            else:
                resp = self._apps.read_namespaced_stateful_set(name, namespace, _preload_content=False,
                                                               _request_timeout=self._timeout)
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise OwnerLookupError(f"reading {kind} {namespace}/{name}: {exc.status} {exc.reason}") from exc
        except Exception as exc:  # urllib3 errors, timeouts
            raise OwnerLookupError(f"reading {kind} {namespace}/{name}: {exc}") from exc
        obj = json.loads(resp.data)
        obj.setdefault("kind", kind)
        return obj

    async def get(self, kind: str, namespace: str, name: str) -> dict | None:
        if kind not in OWNER_KINDS:
            return None
        key = (kind, namespace, name)
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit and hit[0] > now:
            return hit[1]
        if key in self._inflight:  # one read per burst of pods
            return await asyncio.shield(self._inflight[key])
        future = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            obj = await asyncio.to_thread(self._read, kind, namespace, name)
        except BaseException as exc:
            future.set_exception(exc)
            future.exception()  # mark retrieved when nobody else waits
            raise
        finally:
            self._inflight.pop(key, None)
        self._cache[key] = (now + (self._ttl if obj is not None else min(self._ttl, 1.0)), obj)
        future.set_result(obj)
        return obj
