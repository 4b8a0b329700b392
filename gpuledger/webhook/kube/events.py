"""Kubernetes Events for admission decisions (GPUPlaced, GPUWaiting, GPUPlacementDenied), posted off the
request path.

The handler only calls `emit` (never blocks, never raises, no I/O); a background task drains the queue in
batches, finds each placed pod once it is stored, merges repeats and posts them through an `EventWriter`,
rate-limited by a token bucket whose clock is an input. A full queue drops the event and counts it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter

from gpuledger.names import EVENTS_REPORTING_COMPONENT, RESERVATION_ID_KEY, WAITING_ANNOTATION

log = logging.getLogger("gpuledger.events")

PLACED, WAITING, DENIED = "GPUPlaced", "GPUWaiting", "GPUPlacementDenied"
# a LIST answered with each object's metadata only (PartialObjectMetadataList), as `kubectl get -o name` asks
METADATA_ONLY = "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1, application/json"
MAX_MESSAGE = 1024  # what events.k8s.io accepts for a note; core/v1 takes more, kubectl shows less


@dataclass(frozen=True)
class ObjectRef:
    """An Event's involvedObject. `uid` may be empty (a pod that was never stored)."""

    api_version: str
    kind: str
    namespace: str
    name: str
    uid: str = ""

    def as_dict(self) -> dict[str, str]:
        out = {
            "apiVersion": self.api_version,
            "kind": self.kind,
            "namespace": self.namespace,
            "name": self.name,
        }
        if self.uid:
            out["uid"] = self.uid
        return out


@dataclass(frozen=True)
class AdmissionEvent:
    reason: str
    type: str  # Normal | Warning
    message: str
    namespace: str
    involved: ObjectRef | None = None  # None: the placed pod, found by `reservation_id` once it is stored
    reservation_id: str = ""
    queued_at: float = 0.0  # the poster's clock, set by emit
    count: int = 1


def placed(namespace: str, reservation_id: str, message: str) -> AdmissionEvent:
    return AdmissionEvent(PLACED, "Normal", message, namespace, reservation_id=reservation_id)


def waiting(namespace: str, wait_id: str, message: str) -> AdmissionEvent:
    """A pod admitted gated to wait for GPUs (what it waits for, its place in line), found by its ticket's
    id once stored."""
    return AdmissionEvent(WAITING, "Normal", message, namespace, reservation_id=wait_id)


def denied(involved: ObjectRef, message: str) -> AdmissionEvent:
    return AdmissionEvent(DENIED, "Warning", message, involved.namespace, involved=involved)


class EventSink(Protocol):
    def emit(self, event: AdmissionEvent) -> None: ...


class NoEvents:
    def emit(self, event: AdmissionEvent) -> None:
        return None


class EventWriter(Protocol):
    async def find_pods(self, namespace: str, reservation_ids: list[str]) -> dict[str, ObjectRef]:
        """reservation id -> the stored pod carrying it (ids with no stored pod are left out)."""
        ...

    async def create(self, namespace: str, body: dict) -> None: ...


class TokenBucket:
    """`rate` tokens a second up to `burst`; `clock` is an input so tests move time instead of sleeping."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]):
        if rate <= 0 or burst < 1:
            raise ValueError(f"token bucket rate={rate!r} burst={burst!r}: expected rate > 0 and burst >= 1")
        self.rate, self.burst, self.clock = rate, burst, clock
        self.tokens, self.stamp = float(burst), clock()

    def take(self) -> float:
        """0.0 when a token was taken; otherwise the seconds until one will be there (none taken)."""
        now = self.clock()
        self.tokens = min(float(self.burst), self.tokens + max(0.0, now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / self.rate


@dataclass(frozen=True)
class EventSettings:
    queue_size: int = 1000  # events waiting (queued + placed pods not stored yet); beyond it they are dropped
    batch_size: int = 200  # events taken per round
    rate_per_s: float = 20.0  # Event creations a second, sustained
    burst: int = 100
    # a placed pod is looked for this long after its admission (it is stored by then), and the pods not found
    # yet are looked for again at most this often (one LIST per namespace per look)
    look_after_s: float = 0.25
    pod_wait_s: float = 30.0  # then given up: the pod was never stored (another webhook denied it, a timeout)
    # with the cluster sync's pod watch reporting stored pods (`watch_reports`), a placed pod is looked up by
    # LIST only when the watch has not reported it this long after its admission (a watch restarting, resync)
    watch_grace_s: float = 2.0
    component: str = "gpuledger-webhook"


class EventPoster:
    """The queue and the background task that empties it. `clock` (monotonic), `wall` (Event timestamps) and
    `sleep` are inputs; `flush()` is one round and is what the tests drive."""

    def __init__(
        self,
        writer: EventWriter,
        settings: EventSettings | None = None,
        *,
        registry: CollectorRegistry | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep,
        instance: str | None = None,
    ):
        self.writer, self.settings = writer, settings or EventSettings()
        self.clock, self.wall, self.sleep = clock, wall, sleep
        self.instance = instance or socket.gethostname()
        self.bucket = TokenBucket(self.settings.rate_per_s, self.settings.burst, clock)
        self._queue: deque[AdmissionEvent] = deque()
        self._waiting: list[AdmissionEvent] = []  # placed, pod not found stored yet
        # (namespace, reservation id) of the placed events not posted yet, and the stored pods the watch has
        # reported for them (`watch_reports`); the watch's thread reads `_awaited` to skip every other pod
        self._awaited: set[tuple[str, str]] = set()
        self._seen: dict[tuple[str, str], ObjectRef] = {}
        self._watched = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._last_look = float("-inf")
        self._wakeup: asyncio.Event | None = None
        self._task: asyncio.Task | None = None
        self._names = itertools.count()
        registry = registry if registry is not None else CollectorRegistry()
        self.posted = Counter(
            "gpuledger_events_posted", "Kubernetes Events created, by reason", ["reason"], registry=registry
        )
        self.found = Counter(
            "gpuledger_events_pods_found",
            "Placed pods found stored, so their GPUPlaced Event could be posted: by the cluster sync's watch "
            "(watch) or a LIST (list)",
            ["by"],
            registry=registry,
        )
        self.dropped = Counter(
            "gpuledger_events_dropped",
            "Events not posted: queue_full, pod_not_stored (gave up waiting), api_error",
            ["why"],
            registry=registry,
        )

    # ------------------------------------------------------------------ the request path
    def emit(self, event: AdmissionEvent) -> None:
        """Queue an event; drop it (counted) when the queue is full. Never blocks, never raises."""
        try:
            if len(self._queue) + len(self._waiting) >= self.settings.queue_size:
                self.dropped.labels("queue_full").inc()
                return
            self._queue.append(replace(event, queued_at=self.clock()))
            if event.involved is None:
                self._awaited.add((event.namespace, event.reservation_id))
            if self._wakeup is not None:
                self._wakeup.set()
        except Exception:  # an event must never fail an admission
            log.exception("could not queue event %s", event.reason)

    @property
    def pending(self) -> int:
        return len(self._queue) + len(self._waiting)

    # ------------------------------------------------------------------ stored pods, from the cluster sync
    def watch_reports(self) -> Callable[[dict], None]:
        """The callback for the cluster sync's pod watch (`ClusterSync.on_pod_added`, called on its thread
        with each pod it sees added): the placed pods this poster waits for are found there, so no LIST is
        made for them. A pod the watch does not report within `watch_grace_s` is still looked up by LIST."""
        self._watched = True
        return self._reported

    def _reported(self, pod: dict) -> None:
        """On the watch's thread: hand a stored pod this poster waits for over to the loop, skip the rest."""
        meta = pod.get("metadata") or {}
        rid = (meta.get("labels") or {}).get(RESERVATION_ID_KEY) or _wait_id(meta)
        key = (str(meta.get("namespace") or ""), str(rid or ""))
        loop = self._loop
        if not rid or key not in self._awaited or loop is None:
            return
        ref = ObjectRef("v1", "Pod", key[0], str(meta.get("name") or ""), str(meta.get("uid") or ""))
        with contextlib.suppress(RuntimeError):  # the loop closed: nothing left to post
            loop.call_soon_threadsafe(self.stored, key[0], key[1], ref)

    def stored(self, namespace: str, reservation_id: str, ref: ObjectRef) -> None:
        """The pod placed under `reservation_id` is stored as `ref`: its Event can be posted now."""
        key = (namespace, reservation_id)
        if key in self._awaited:
            self._seen[key] = ref
            if self._wakeup is not None:
                self._wakeup.set()

    # ------------------------------------------------------------------ one round
    async def flush(self) -> int:
        """Take a batch, find the placed pods that are due, merge repeats, post: the Events created."""
        ready: list[AdmissionEvent] = []
        for _ in range(min(self.settings.batch_size, len(self._queue))):
            event = self._queue.popleft()
            (ready if event.involved is not None else self._waiting).append(event)
        ready += await self._resolve()
        created = 0
        for event in merge(ready):
            ref = event.involved
            if ref is None:  # never: `ready` holds only events whose object is known
                continue
            wait = self.bucket.take()
            while wait > 0:
                await self.sleep(wait)
                wait = self.bucket.take()
            try:
                await self.writer.create(event.namespace, self.body(event))
            except Exception as exc:  # noqa: BLE001 - the API said no or is down: count, log, go on
                self.dropped.labels("api_error").inc(event.count)
                log.warning(
                    "could not post event %s on %s %s/%s: %s",
                    event.reason,
                    ref.kind,
                    event.namespace,
                    ref.name,
                    exc,
                )
                continue
            self.posted.labels(event.reason).inc(event.count)
            created += 1
        return created

    def _look_after(self) -> float:
        return self.settings.watch_grace_s if self._watched else self.settings.look_after_s

    async def _listed(self, now: float) -> dict[tuple[str, str], ObjectRef]:
        """The stored pods of the waiting events due a LIST (the watch has not reported them in time), at
        most one round every look_after_s, one LIST per namespace."""
        if now < self._last_look + self.settings.look_after_s:
            return {}
        by_namespace: dict[str, list[str]] = {}
        for event in self._waiting:
            key = (event.namespace, event.reservation_id)
            if key not in self._seen and now - event.queued_at >= self._look_after():
                by_namespace.setdefault(event.namespace, []).append(event.reservation_id)
        if not by_namespace:
            return {}
        self._last_look = now
        found: dict[tuple[str, str], ObjectRef] = {}
        for namespace, ids in by_namespace.items():
            try:
                pods = await self.writer.find_pods(namespace, ids)
            except Exception as exc:  # noqa: BLE001 - look again next round
                log.warning("could not look up placed pods in %s: %s", namespace, exc)
                continue
            found.update({(namespace, rid): ref for rid, ref in pods.items()})
        return found

    async def _resolve(self) -> list[AdmissionEvent]:
        """Placed pods found stored (reported by the watch, or listed) become ready; those waited on too long
        are dropped."""
        now = self.clock()
        listed = await self._listed(now)
        ready, still = [], []
        for event in self._waiting:
            key = (event.namespace, event.reservation_id)
            ref, by = self._seen.get(key), "watch"
            if ref is None:
                ref, by = listed.get(key), "list"
            if ref is not None:
                ready.append(replace(event, involved=ref))
                self.found.labels(by).inc()
            elif now - event.queued_at >= self.settings.pod_wait_s:
                self.dropped.labels("pod_not_stored").inc()
            else:
                still.append(event)
                continue
            self._awaited.discard(key)
            self._seen.pop(key, None)
        self._waiting = still
        return ready

    def body(self, event: AdmissionEvent) -> dict:
        """A core/v1 Event as kube-apiserver accepts it (its namespace is the involved object's)."""
        ref = event.involved
        if ref is None:
            raise ValueError(f"event {event.reason!r} names no object yet: post it once its pod is found")
        stamp = datetime.fromtimestamp(self.wall(), UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        suffix = f".{int(self.wall() * 1e9):x}{next(self._names):x}"
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": ref.name[: 253 - len(suffix)] + suffix, "namespace": event.namespace},
            "involvedObject": ref.as_dict(),
            "reason": event.reason,
            "message": event.message[:MAX_MESSAGE],
            "type": event.type,
            "count": event.count,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "source": {"component": self.settings.component},
            "reportingComponent": EVENTS_REPORTING_COMPONENT,
            "reportingInstance": self.instance[:128],
        }

    # ------------------------------------------------------------------ the background task
    def _next_delay(self) -> float | None:
        """0: work now; >0: the first waiting pod is due then; None: idle until something is emitted."""
        if self._queue:
            return 0.0
        if not self._waiting:
            return None
        if self._seen:  # the watch reported a waiting pod: post its Event now
            return 0.0
        first_due = min(e.queued_at for e in self._waiting) + self._look_after()
        return max(first_due, self._last_look + self.settings.look_after_s) - self.clock()

    async def run(self) -> None:
        self._wakeup = asyncio.Event()
        self._loop = asyncio.get_running_loop()
        while True:
            delay = self._next_delay()
            if delay is None or delay > 0:
                with contextlib.suppress(TimeoutError):  # no task per wait, as wait_for would make
                    async with asyncio.timeout(delay):
                        await self._wakeup.wait()
                self._wakeup.clear()
                if delay is None or self._queue:
                    continue
            try:
                await self.flush()
            except Exception:  # the task must outlive any one bad round
                log.exception("event round failed")

    def start(self) -> EventPoster:
        if self._task is None or self._task.done():
            self._task = asyncio.get_running_loop().create_task(self.run(), name="gpuledger-events")
        return self

    async def stop(self) -> None:
        self._loop = None  # the watch stops handing pods over
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # stopping: its errors were logged
                await self._task
            self._task = None
        close = getattr(
            self.writer, "close", None
        )  # a writer holding a session (gpuledger.webhook.kube.event_writer)
        if close is not None:
            with contextlib.suppress(Exception):  # stopping: nothing left to post
                await close()


def _wait_id(meta: dict) -> str:
    """The id of the waiting ticket a gated pod carries ("" when none): its GPUWaiting Event is found by
    it."""
    text = (meta.get("annotations") or {}).get(WAITING_ANNOTATION)
    if not isinstance(text, str):
        return ""
    try:
        ticket = json.loads(text)
    except ValueError:
        return ""
    rid = ((ticket.get("req") if isinstance(ticket, dict) else None) or {}).get("id")
    return rid if isinstance(rid, str) else ""


def merge(events: list[AdmissionEvent]) -> list[AdmissionEvent]:
    """Identical events (same object, reason, message) become one with their counts added, in first order."""
    merged: dict[tuple, AdmissionEvent] = {}
    for event in events:
        key = (event.namespace, event.involved, event.reason, event.type, event.message)
        prior = merged.get(key)
        merged[key] = event if prior is None else replace(prior, count=prior.count + event.count)
    return list(merged.values())
