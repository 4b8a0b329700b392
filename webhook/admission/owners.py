"""Where a pod's owners come from: the API server (serve) or the input files (explain).

Users write GPU annotations on the workload (a Job, a Deployment, a PyTorchJob), so the webhook reads the
pod's controllers. The lookup is an interface so the handler never knows whether it talks to the API or to a
list of objects; it only reads, and it reads only the workload kinds below.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

# group owners: their parallelism / replicas make the pods a gang (request_from_pod), explain expands them
OWNER_KINDS = ("Job", "StatefulSet")


@dataclass(frozen=True)
class WorkloadKind:
    group: str
    version: str
    plural: str

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


# every controller kind whose annotations reach its pods (the chain walk follows these, nothing else)
WORKLOAD_KINDS: dict[str, WorkloadKind] = {
    "Job": WorkloadKind("batch", "v1", "jobs"),
    "StatefulSet": WorkloadKind("apps", "v1", "statefulsets"),
    "ReplicaSet": WorkloadKind("apps", "v1", "replicasets"),
    "Deployment": WorkloadKind("apps", "v1", "deployments"),
    "PyTorchJob": WorkloadKind("kubeflow.org", "v1", "pytorchjobs"),
    "MPIJob": WorkloadKind("kubeflow.org", "v1", "mpijobs"),
    "TFJob": WorkloadKind("kubeflow.org", "v1", "tfjobs"),
}


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

    def __init__(self, objects: Iterable[object] = ()):
        self._by_key: dict[tuple[str, str, str], dict] = {}
        for obj in objects:
            self.add(obj)

    def add(self, obj: object) -> None:
        if isinstance(obj, dict) and obj.get("kind") in WORKLOAD_KINDS:
            meta = obj.get("metadata") or {}
            self._by_key[(obj["kind"], meta.get("namespace") or "default", meta.get("name", ""))] = obj

    async def get(self, kind: str, namespace: str, name: str) -> dict | None:
        return self._by_key.get((kind, namespace or "default", name))


class KubeObjectReader:
    """Reads one workload object through the `kubernetes` client (blocking: run it on a thread)."""

    def __init__(self, api_client: Any, timeout_s: float = 2.0):
        from kubernetes import client  # the adapter's dependency, not the handler's

        self._objects = client.CustomObjectsApi(api_client)  # serves built-in groups as well as kubeflow.org
        self._timeout = timeout_s

    def __call__(self, kind: str, namespace: str, name: str) -> dict | None:
        from kubernetes.client.exceptions import ApiException

        what = WORKLOAD_KINDS[kind]
        try:
            resp = self._objects.get_namespaced_custom_object(
                what.group,
                what.version,
                namespace,
                what.plural,
                name,
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise OwnerLookupError(f"reading {kind} {namespace}/{name}: {exc.status} {exc.reason}") from exc
        except Exception as exc:  # urllib3 errors, timeouts
            raise OwnerLookupError(f"reading {kind} {namespace}/{name}: {exc}") from exc
        # with _preload_content=False the client returns the raw urllib3 response, not the decoded object
        obj = json.loads(resp.data)  # type: ignore[attr-defined]
        obj.setdefault("kind", kind)
        return obj


class CachedOwners:
    """Any blocking reader `(kind, namespace, name) -> dict | None`, run on a thread and briefly cached.

    A Job's pods arrive in a burst (parallelism N), so one read serves the whole burst; the cache keeps
    misses too, for a shorter time. `clock` is an input so tests expire entries without sleeping.
    """

    def __init__(
        self,
        read: Callable[[str, str, str], dict | None],
        ttl_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._read, self._ttl, self._clock = read, ttl_s, clock
        self._cache: dict[tuple[str, str, str], tuple[float, dict | None]] = {}
        self._inflight: dict[tuple[str, str, str], asyncio.Future] = {}
        self.reads = 0

    async def get(self, kind: str, namespace: str, name: str) -> dict | None:
        if kind not in WORKLOAD_KINDS:
            return None
        key = (kind, namespace, name)
        now = self._clock()
        hit = self._cache.get(key)
        if hit and hit[0] > now:
            return hit[1]
        if key in self._inflight:  # one read per burst of pods
            return await asyncio.shield(self._inflight[key])
        future = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        try:
            self.reads += 1
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


class KubeOwners(CachedOwners):
    """The pod's controllers read through the API (Jobs, StatefulSets, ReplicaSets, Deployments, kubeflow.org
    jobs), cached `ttl_s`."""

    def __init__(self, api_client: Any, ttl_s: float = 5.0, timeout_s: float = 2.0):
        super().__init__(KubeObjectReader(api_client, timeout_s), ttl_s)
