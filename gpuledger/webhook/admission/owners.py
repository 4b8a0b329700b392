"""Where a pod's owners come from: the API server (serve) or the input files (explain).

Users write GPU annotations on the workload (a Job, a Deployment, a PyTorchJob), so the webhook reads the
pod's controllers. The lookup is an interface so the handler never knows whether it talks to the API or to a
list of objects; it only reads, and it reads only the workload kinds below.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol
from urllib.parse import quote

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
    # Kubernetes' own gangs (GenericWorkload, beta in 1.37): a pod names its PodGroup in
    # spec.schedulingGroup.podGroupName, the PodGroup its Workload; both read, never followed by owner refs
    "PodGroup": WorkloadKind("scheduling.k8s.io", "v1beta1", "podgroups"),
    "Workload": WorkloadKind("scheduling.k8s.io", "v1beta1", "workloads"),
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
    """Reads one workload object from the API server on the running loop (gpuledger.webhook.kube.api: a few
    kept-alive
    connections of the webhook's own; a read through the `kubernetes` client cost a thread hop and ~1.7 ms of
    CPU, this one ~0.3 ms, on the admission's critical path whenever the cache misses)."""

    def __init__(self, api_client: Any, timeout_s: float = 2.0, connections: int = 4):
        from gpuledger.webhook.kube.api import KubeApi  # the adapter's dependency, not the handler's

        self.api = KubeApi(api_client, connections, timeout_s)

    async def __call__(self, kind: str, namespace: str, name: str) -> dict | None:
        what = WORKLOAD_KINDS[kind]
        root = f"/apis/{what.group}/{what.version}" if what.group else f"/api/{what.version}"
        path = f"{root}/namespaces/{quote(namespace, safe='')}/{what.plural}/{quote(name, safe='')}"
        what_read = f"reading {kind} {namespace}/{name}"
        try:
            status, data = await self.api.call("GET", path)
        except (ConnectionError, OSError, TimeoutError) as exc:  # the connection's errors, a timeout
            raise OwnerLookupError(f"{what_read}: {exc!r}") from exc
        if status == 404:
            return None
        if status != 200:
            raise OwnerLookupError(f"{what_read}: HTTP {status}{_status_message(data)}")
        try:
            obj = json.loads(data)
        except ValueError as exc:
            raise OwnerLookupError(f"{what_read}: the answer is not JSON ({exc})") from exc
        if not isinstance(obj, dict):
            raise OwnerLookupError(f"{what_read}: the answer is not a JSON object")
        obj.setdefault("kind", kind)
        return obj

    async def close(self) -> None:
        await self.api.close()


def _status_message(data: bytes) -> str:
    """ ": <the API's message>" from a Status body, "" when it has none."""
    try:
        message = json.loads(data).get("message")
    except (ValueError, AttributeError):
        return ""
    return f": {message}" if isinstance(message, str) and message else ""


class CachedOwners:
    """Any reader `async (kind, namespace, name) -> dict | None`, briefly cached.

    A Job's pods arrive in a burst (parallelism N), so one read serves the whole burst; the cache keeps
    misses too, for a shorter time. `clock` is an input so tests expire entries without sleeping.
    """

    def __init__(
        self,
        read: Callable[[str, str, str], Awaitable[dict | None]],
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
            obj = await self._read(kind, namespace, name)
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
        self.reader = KubeObjectReader(api_client, timeout_s)
        super().__init__(self.reader, ttl_s)

    async def close(self) -> None:
        """End the reader's connections (the app's cleanup)."""
        await self.reader.close()
