"""Keeps the GPU ledger true to the cluster: watches Nodes and Pods (and what queues and preemption read:
Namespaces, GPUQueues, PodDisruptionBudgets; and the ResourceSlices in which DRA drivers publish GPUs) and
forwards what changed, in batches.

The API server is the durable truth and the ledger a cache of it, so this adapter decides nothing: it relays
watch events (the ledger confirms, counts and releases), rebuilds the ledger from a full list whenever the
stream can no longer be trusted (410 Gone, a broken watch, a ledger that restarted empty), and asks the API
about expiring reservations before the ledger drops one whose pod was stored after all.

The `kubernetes` watch client blocks, so each watch runs in its own thread; one forwarding thread owns every
call to the ledger, which keeps those calls ordered and batched (one actor call per batch, not per event).
Every webhook replica runs a sync, but only the one holding the ledger's sync lease writes
(gpuledger.service.sync_writer: two streams interleaved would free a device twice); a lease thread takes or
renews
it, the others stand by, watching (the webhook's Events read the pod stream) and dropping what they see, and
a sync that takes the lease starts with a full list.
Its collaborators, each its own idea: the targets (gpuledger.sync.targets), config and counters
(gpuledger.sync.config), the expiry check (gpuledger.sync.expiry) and the conflict Events
(gpuledger.sync.conflicts).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import queue
import secrets
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import orjson

from gpuledger.names import (
    GPUQUEUE_PLURAL,
    QUEUE_GROUP,
    QUEUE_VERSION,
    RESOURCE_GROUP,
    RESOURCE_SLICE_PLURAL,
    RESOURCE_VERSION,
)
from gpuledger.service.sync_writer import is_fenced
from gpuledger.sync.config import (
    API_VERSIONS,
    KINDS,
    NAMESPACE,
    NODE,
    PDB,
    POD,
    QUEUE,
    SLICE,
    SyncConfig,
    SyncStats,
)
from gpuledger.sync.conflicts import ConflictReports
from gpuledger.sync.device_events import DeviceTruthReports
from gpuledger.sync.evictor import Evictor
from gpuledger.sync.expiry import ExpiryChecks
from gpuledger.sync.placer import WaitingPlacer
from gpuledger.sync.queue_status import QueueStatusWriter
from gpuledger.sync.targets import LedgerTarget

__all__ = ["ClusterSync", "slim"]

log = logging.getLogger("gpuledger.sync")

# the resume point of a kind whose API is not served (the GPUQueue CRD not installed, resource.k8s.io/v1 on a
# Kubernetes before 1.34): none of it exists
ABSENT = "<absent>"


# kinds slimmed to a few fields: a change to any other is not forwarded
SLIMMED = (NAMESPACE, QUEUE, PDB, SLICE)


def _key(obj: dict) -> tuple[str, str, str]:
    meta = obj.get("metadata") or {}
    return (str(obj.get("kind", "")), str(meta.get("namespace", "")), str(meta.get("name", "")))


class _Gone(Exception):
    """The API server no longer has the resourceVersion a watch resumes from."""


def _pick(mapping: Any, keys: tuple[str, ...]) -> dict:
    mapping = mapping if isinstance(mapping, dict) else {}
    return {k: mapping[k] for k in keys if k in mapping}


def slim(obj: dict, kind: str | None = None) -> dict:
    """Drop what the ledger never reads (managedFields are most of a pod's bytes) and fill in kind/apiVersion,
    which list responses omit on their items. A Namespace keeps only its name and labels, a
    PodDisruptionBudget its selector and how many disruptions it allows, a GPUQueue its spec, a ResourceSlice
    its name and spec (what its driver publishes)."""
    kind = kind or obj.get("kind")
    meta = obj.get("metadata") or {}
    if kind == NAMESPACE:
        return {"kind": kind, "apiVersion": "v1", "metadata": _pick(meta, ("name", "labels"))}
    if kind == PDB:
        return {
            "kind": kind,
            "apiVersion": API_VERSIONS[PDB],
            "metadata": _pick(meta, ("name", "namespace", "uid")),
            "spec": _pick(obj.get("spec"), ("selector",)),
            "status": _pick(obj.get("status"), ("disruptionsAllowed",)),
        }
    if kind == QUEUE:  # its status is gpuledger's own writing (gpuledger.sync.queue_status)
        return {
            "kind": kind,
            "apiVersion": API_VERSIONS[QUEUE],
            "metadata": _pick(meta, ("name", "uid", "labels", "creationTimestamp")),
            "spec": obj.get("spec") or {},
        }
    if kind == SLICE:
        return {
            "kind": kind,
            "apiVersion": API_VERSIONS[SLICE],
            "metadata": _pick(meta, ("name", "uid")),
            "spec": obj.get("spec") or {},
        }
    if "managedFields" in meta:
        obj = dict(obj, metadata={k: v for k, v in meta.items() if k != "managedFields"})
    if kind and "kind" not in obj:
        obj = dict(obj, kind=kind, apiVersion=API_VERSIONS.get(kind, "v1"))
    return obj


class ClusterSync:
    """Watch Nodes, ResourceSlices, Pods of every namespace, Namespaces, GPUQueues and PodDisruptionBudgets
    into a `LedgerTarget`. `start()` runs it; `stop()` ends it."""

    def __init__(
        self,
        api_client,
        target: LedgerTarget,
        config: SyncConfig | None = None,
        clock: Callable[[], float] = time.time,
        identity: str = "",
    ):
        from kubernetes import client

        self.core = client.CoreV1Api(api_client)
        self.policy = client.PolicyV1Api(api_client)
        self.custom = client.CustomObjectsApi(api_client)
        self.target = target
        self.config = config or SyncConfig()
        self.clock = clock
        self.stats = SyncStats()
        self._events: queue.Queue = queue.Queue()
        self._lock = threading.Condition()
        self._generation = 0
        self._resume_from: dict[str, str | None] = dict.fromkeys(KINDS)
        self._responses: dict[str, Any] = {}
        self._resync_needed: str | None = "initial list"
        self._resync_asked = 0  # requests so far: one made during a resync is not cleared by its end
        self._stop = threading.Event()
        self._synced = threading.Event()
        self._threads: list[threading.Thread] = []
        # the slimmed Namespaces, GPUQueues and budgets last sent, by (kind, namespace, name): most of their
        # changes are of fields the ledger does not read, and are not sent again (their watch threads write)
        self._forwarded: dict[tuple[str, str, str], dict] = {}
        # who this sync is to the ledger's sync lease: unique per process start, so a restarted replica is a
        # new holder (and lists first)
        self.identity = identity or f"{socket.gethostname()}/{os.getpid()}/{secrets.token_hex(4)}"
        self._term: tuple[str, int] | None = None  # (ledger incarnation, epoch) of the lease this sync holds
        self._lease_wakeup = threading.Event()
        self._lease_answered = threading.Event()  # the first answer: the first list waits for it, briefly
        # the kubelets' word against the ledger's: counted, and an Event on each pod
        # (gpuledger.sync.device_events)
        self.device_reports = DeviceTruthReports(lambda: self.core, clock)
        # the placement conflicts the ledger lists, counted and told to their pods (gpuledger.sync.conflicts)
        self.conflicts = ConflictReports(lambda: self.core, clock, self.stats)
        # before the ledger drops an expired reservation, the API is asked whether a stored pod carries it
        # (gpuledger.sync.expiry)
        self.expiry = ExpiryChecks(
            self.config, self.stats, target, self.identity, self._raw_list, self.list_objects
        )
        # called on the pod watch's thread with each pod it sees added (slimmed); they must be quick and not
        # raise (an exception is logged and the watch goes on): the webhook's Events find placed pods here
        self.on_pod_added: list[Callable[[dict], None]] = []
        # writes the ledger's placements of waiting pods and removes their gate (gpuledger.sync.placer); asked
        # on this sync's forwarding thread, the one that calls the ledger, right after what freed GPUs
        self.placer = WaitingPlacer(self.core, self.config.affinity_key, clock)
        # carries out the preemptions the ledger planned (gpuledger.sync.evictor): asked on the forwarding
        # thread right after the placer
        self.evictor = Evictor(self.core, clock)
        self.stats.evictions = self.evictor.stats  # exported with the sync's (gpuledger_preemption_evictions)
        # writes each GPUQueue's status from the ledger while this sync leads (gpuledger.sync.queue_status)
        self.queue_status = QueueStatusWriter(
            self.custom,
            target,
            lambda: self.identity if self.stats.leading else None,
            self.config.queue_status_interval_s,
            clock,
        )

    # ------------------------------------------------------------------ lifecycle
    def start(self) -> ClusterSync:
        self.placer.start()
        self.evictor.start()
        self.queue_status.start()
        self._threads = [
            threading.Thread(target=self._lease_loop, name="gpuledger-sync-lease", daemon=True),
            threading.Thread(target=self._forward_loop, name="gpuledger-sync", daemon=True),
        ] + [
            threading.Thread(
                target=self._watch_loop, args=(kind,), name=f"gpuledger-watch-{kind.lower()}s", daemon=True
            )
            for kind in KINDS
        ]
        for t in self._threads:
            t.start()
        return self

    def stop(self, timeout: float = 10.0, hand_back: bool = True) -> None:
        """End the threads, then hand the sync lease back so another replica's sync takes over at once
        (`hand_back=False` leaves it to lapse, as a crash would)."""
        self._stop.set()
        self._lease_wakeup.set()
        self._events.put((-1, None))  # wakes the forwarding thread from its wait for events
        with self._lock:
            self._lock.notify_all()
        for kind in KINDS:
            self._interrupt(kind)
        for t in self._threads:
            t.join(timeout)
        self.placer.stop()
        self.evictor.stop()
        self.queue_status.stop()
        if hand_back and self.stats.leading:
            try:
                self.target.sync_lease(self.identity, self.config.lease_term_s, True)
            except Exception as exc:  # noqa: BLE001 - the ledger is gone: the lease lapses within its term
                log.warning("sync: could not hand the ledger's sync lease back: %r", exc)
            self.stats.leading = False

    @property
    def leading(self) -> bool:
        """Whether this sync holds the ledger's sync lease (and so writes the ledger)."""
        return self.stats.leading

    def wait_synced(self, timeout: float = 30.0) -> bool:
        """True once a full list has reached the ledger (after start, or after the last forced resync)."""
        return self._synced.wait(timeout)

    def request_resync(self, reason: str) -> None:
        with self._lock:
            if self._resync_needed is None:
                self._resync_needed = reason
            self._resync_asked += 1
            self._synced.clear()
            self._lock.notify_all()

    def __enter__(self) -> ClusterSync:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    # ------------------------------------------------------------------ listing
    def _raw_list(self, kind: str) -> Callable[..., Any]:
        """The list call for `kind`. Every call here passes `_preload_content=False`, so it returns the raw
        urllib3 response (`.data`, `.release_conn()`), not the V1NodeList/V1PodList the client's hints say."""
        if kind == QUEUE:
            return lambda **kw: self.custom.list_cluster_custom_object(
                QUEUE_GROUP, QUEUE_VERSION, GPUQUEUE_PLURAL, **kw
            )
        if kind == SLICE:  # a built-in group, read as plain dicts through the same generic path
            return lambda **kw: self.custom.list_cluster_custom_object(
                RESOURCE_GROUP, RESOURCE_VERSION, RESOURCE_SLICE_PLURAL, **kw
            )
        calls: dict[str, Callable[..., Any]] = {
            NODE: self.core.list_node,
            POD: self.core.list_pod_for_all_namespaces,
            NAMESPACE: self.core.list_namespace,
            PDB: self.policy.list_pod_disruption_budget_for_all_namespaces,
        }
        return calls[kind]

    def _absent(self, kind: str, exc: BaseException) -> bool:
        """The GPUQueue API is not served (its CRD not installed), or resource.k8s.io/v1 is not (a Kubernetes
        before 1.34): none of the kind exists, which is not an error. A kind only queues or the DRA
        recognition read that this sync may not list (an install whose RBAC predates them) is treated alike,
        with a warning: placement goes on without them."""
        status = getattr(exc, "status", None)
        if kind in (QUEUE, SLICE) and status == 404:
            return True
        if kind in (QUEUE, NAMESPACE, PDB, SLICE) and status == 403:
            reason = getattr(exc, "reason", "")
            log.warning("sync: may not list %ss (%s): treated as none; grant list and watch", kind, reason)
            return True
        return False

    def list_objects(self, kind: str) -> tuple[list[dict], str]:
        """Every object of `kind`, page by page, as plain dicts, with the list's resourceVersion (`ABSENT`,
        and no objects, for a GPUQueue API not served)."""
        from kubernetes.client.exceptions import ApiException

        fn = self._raw_list(kind)
        items: list[dict] = []
        token, version = None, ""
        while True:
            kwargs: dict[str, Any] = {"limit": self.config.list_page_size, "_preload_content": False}
            if token:
                kwargs["_continue"] = token
            try:
                body = json.loads(fn(**kwargs).data)
            except ApiException as exc:
                if self._absent(kind, exc):
                    return [], ABSENT
                raise
            items.extend(slim(obj, kind) for obj in body.get("items") or [])
            meta = body.get("metadata") or {}
            version = version or meta.get("resourceVersion", "")
            token = meta.get("continue")
            if not token:
                return items, version

    def list_version(self, kind: str) -> str:
        """The current resourceVersion of `kind`'s list (a page of one): where a standby's watch starts."""
        from kubernetes.client.exceptions import ApiException

        try:
            body = json.loads(self._raw_list(kind)(limit=1, _preload_content=False).data)
        except ApiException as exc:
            if self._absent(kind, exc):
                return ABSENT
            raise
        return str((body.get("metadata") or {}).get("resourceVersion", ""))

    def resync(self, reason: str) -> None:
        """Rebuild the ledger from a full list and resume every watch from its list's resourceVersion.
        Standing by (another sync holds the lease), only the watches restart: from the lists' current
        versions, nothing sent."""
        with self._lock:
            self._generation += 1
            self._resume_from = dict.fromkeys(KINDS)
            asked, to_ledger = self._resync_asked, self.stats.leading
        for kind in KINDS:  # old streams stop at once instead of at their next event or timeout
            self._interrupt(kind)
        listed: dict[str, list[dict]] = {kind: [] for kind in KINDS}
        versions: dict[str, str | None] = {}
        if to_ledger:
            for kind in KINDS:
                listed[kind], versions[kind] = self.list_objects(kind)
            self.target.resync([obj for kind in KINDS for obj in listed[kind]], self.identity)
            self._forwarded = {_key(o): o for kind in SLIMMED for o in listed[kind]}
        else:
            versions = {kind: self.list_version(kind) for kind in KINDS}
        nodes, pods = listed[NODE], listed[POD]
        with self._lock:
            self._resume_from = versions
            if self._resync_asked == asked:  # else asked again meanwhile (a new term): another list follows
                self._resync_needed = None
            self._lock.notify_all()
        if not to_ledger:
            log.info("sync: standing by, watching from the current lists (%s)", reason)
            return
        self.stats.resyncs += 1
        self.stats.resync_reasons.append(reason)
        self._synced.set()
        log.info("resynced %d nodes and %d pods (%s)", len(nodes), len(pods), reason)

    # ------------------------------------------------------------------ threads
    def _backoff(self, failures: int) -> float:
        first, largest = self.config.retry_backoff_s
        return min(largest, first * (2 ** min(failures, 10)))

    # ------------------------------------------------------------------ the sync lease
    def _lease_loop(self) -> None:
        """Take or renew the ledger's sync lease every `lease_renew_s` (at once when a write was fenced)."""
        while not self._stop.is_set():
            try:
                self.lease_answer(self.target.sync_lease(self.identity, self.config.lease_term_s))
                self._lease_answered.set()
            # everything, on purpose: the actor restarting; its fencing of the writes keeps the ledger safe
            except Exception as exc:  # noqa: BLE001
                self.stats.lease_errors += 1
                log.warning("sync: asking for the ledger's sync lease failed: %r", exc)
            self._lease_wakeup.wait(self.config.lease_renew_s)
            self._lease_wakeup.clear()

    def lease_answer(self, answer: dict) -> None:
        """Lead or stand by as the ledger answered; a new term starts with a full list."""
        held = bool(answer.get("held"))
        term = (str(answer.get("incarnation", "")), int(answer.get("epoch", 0)))
        with self._lock:  # the list is asked for before the forwarding thread can see it leads
            new_term = held and term != self._term
            if new_term:
                self.request_resync(f"took the sync lease (term {term[1]})")
            was, self.stats.leading = self.stats.leading, held
            self._term = term if held else None
        if new_term:
            self.stats.lease_taken += 1
            log.info("sync: %s holds the ledger's sync lease (term %s); listing first", self.identity, term)
        elif was and not held:
            self.stats.lease_lost += 1
            log.warning("sync: the ledger's sync lease went to %r; standing by", answer.get("holder"))
        if not held:
            self._synced.clear()

    def _fenced(self, exc: BaseException) -> None:
        """The ledger refused a write: this sync does not hold the lease (or its term changed). Stand by, and
        ask again now; a term it is given again starts with a full list."""
        self.stats.fenced += 1
        with self._lock:
            self.stats.leading, self._term = False, None
        log.warning("sync: %s", exc)
        self._lease_wakeup.set()

    def _stand_by(self) -> None:
        """While another sync writes: drop what the watches queue (the list of a new term covers it)."""
        dropped = len(self._next_batch(0.2))
        self.stats.events_dropped += dropped

    def _forward_loop(self) -> None:
        failures = 0
        next_status = next_expiry = time.monotonic()
        # the holder lists once, not a standby's list first: the lease's first answer is usually quick
        self._lease_answered.wait(5.0)
        while not self._stop.is_set():
            try:
                with self._lock:
                    reason = self._resync_needed
                if reason:
                    self.resync(reason)
                    next_status = time.monotonic() + self.config.status_interval_s
                    if self.stats.leading:
                        self._after_apply()
                if not self.stats.leading:
                    self._stand_by()
                    continue
                wait = max(0.0, min(next_status, next_expiry) - time.monotonic())
                batch = self._next_batch(wait)
                if batch:
                    self.target.apply_events(batch, self.identity)
                    self.stats.events_applied += len(batch)
                    self.stats.batches += 1
                    self._after_apply()  # what the batch freed, placed; what the ledger planned, carried out
                if time.monotonic() >= next_status:
                    next_status = time.monotonic() + self.config.status_interval_s
                    status = self.target.status() or {}
                    if status.get("synced") is False:
                        self.request_resync("ledger restarted empty")
                    self.conflicts.report(status.get("conflicts") or [])
                    self.device_reports.report(status)
                    if status.get("waiting"):  # a safety net: placements no event prompted
                        self._after_apply()
                if time.monotonic() >= next_expiry:
                    next_expiry = time.monotonic() + self.config.expiry_interval_s
                    self.expiry.check_expiry(self.clock())
                    self._after_apply()  # what expired, given to the line
                failures = 0
            # everything, on purpose: the ledger (actor restarting) or the API is unavailable, and this
            # thread must outlive that; it logs, backs off and rebuilds the ledger from a full list
            except Exception as exc:  # noqa: BLE001
                if self._stop.is_set():
                    return
                if is_fenced(exc):
                    self._fenced(exc)
                    continue
                failures += 1
                self.stats.target_errors += 1
                self.stats.last_error = f"{type(exc).__name__}: {exc}"
                log.warning(
                    "sync: %s; full resync after %.1fs", self.stats.last_error, self._backoff(failures)
                )
                self.request_resync(f"error: {type(exc).__name__}")
                self._stop.wait(self._backoff(failures))

    def _after_apply(self) -> None:
        """What the ledger decided after a change: placements of waiting pods, then the preemptions due."""
        self.placer.after_apply(self.target, self.identity)
        self.evictor.after_apply(self.target, self.identity)

    def _next_batch(self, wait: float) -> list[tuple[str, dict]]:
        """The next events of the current generation: waits up to `wait` for the first, lingers for more."""
        batch: list[tuple[str, dict]] = []
        deadline = None
        while len(batch) < self.config.batch_max and not self._stop.is_set():
            timeout = wait if deadline is None else deadline - time.monotonic()
            try:
                if timeout <= 0:
                    generation, event = self._events.get_nowait()
                else:
                    generation, event = self._events.get(timeout=timeout)
            except queue.Empty:
                break
            if generation != self._generation:
                continue  # from a stream the last resync replaced: the list already covered it
            batch.append(event)
            if deadline is None:
                deadline = time.monotonic() + self.config.batch_linger_s
            with self._lock:
                if self._resync_needed:
                    break
        return batch

    def _interrupt(self, kind: str) -> None:
        resp = self._responses.get(kind)
        if resp is not None:
            with contextlib.suppress(Exception):  # already closed: whatever it raises, it is closed
                resp.shutdown()

    def _watch_loop(self, kind: str) -> None:
        failures = 0
        while not self._stop.is_set():
            with self._lock:
                version = self._resume_from[kind]
                while not self._stop.is_set() and (version is None or self._resync_needed):
                    self._lock.wait(1.0)
                    version = self._resume_from[kind]
                if self._stop.is_set() or version is None:  # version is set unless stopping
                    return
                generation = self._generation
            try:
                if version == ABSENT:
                    self._await_kind(kind, generation)
                    continue
                self._watch_once(kind, generation, version)
                failures = 0
            except _Gone:
                self.stats.gone += 1
                self._resync_from(generation, f"{kind} watch: 410 Gone")
            # everything, on purpose: the watch thread must outlive any failure of one stream
            except Exception as exc:  # noqa: BLE001
                if self._stop.is_set():
                    return
                with self._lock:
                    replaced = generation != self._generation
                if replaced:
                    continue  # interrupted on purpose by a resync
                # a broken connection resumes from the last resourceVersion (the API server answers 410 if
                # it can no longer serve it); only a watch that keeps failing is replaced by a full list
                failures += 1
                self.stats.watch_errors += 1
                self.stats.last_error = f"{kind} watch: {type(exc).__name__}: {exc}"
                log.warning("%s (attempt %d)", self.stats.last_error, failures)
                self._stop.wait(self._backoff(failures))
                if failures >= self.config.watch_retries:
                    failures = 0
                    self._resync_from(generation, f"{kind} watch error: {type(exc).__name__}")

    def _await_kind(self, kind: str, generation: int) -> None:
        """A kind whose API was not served at the last list (the GPUQueue CRD not installed): try its list
        every `absent_retry_s`; once served, forward what it holds as added (leading) and watch from there."""
        if self._stop.wait(self.config.absent_retry_s):
            return
        with self._lock:
            if generation != self._generation:
                return
            leading = self.stats.leading
        items, version = self.list_objects(kind) if leading else ([], self.list_version(kind))
        if version == ABSENT:
            return
        with self._lock:
            if generation != self._generation:
                return  # a full list replaced this one meanwhile
            for obj in items:
                self._events.put((generation, ("ADDED", obj)))
                self._forwarded[_key(obj)] = obj
            self._resume_from[kind] = version
        log.info("sync: the %s API is served now: %d forwarded, watching", kind, len(items))

    def _unchanged(self, kind: str, etype: str, obj: dict) -> bool:
        """A change of what the ledger does not read (a budget's health counts, the status gpuledger writes on
        a GPUQueue, a namespace's annotations) is not forwarded: its slimmed object is the one last sent."""
        if kind not in SLIMMED:
            return False
        key = _key(obj)
        if etype == "DELETED":
            self._forwarded.pop(key, None)
            return False
        if etype == "MODIFIED" and self._forwarded.get(key) == obj:
            return True
        self._forwarded[key] = obj
        return False

    def _resync_from(self, generation: int, reason: str) -> None:
        with self._lock:
            if generation == self._generation:
                self._resume_from = dict.fromkeys(KINDS)
        self.request_resync(reason)

    def _pod_added(self, pod: dict) -> None:
        for listener in self.on_pod_added:
            try:
                listener(pod)
            except Exception:  # a listener's bug must not stop the watch the ledger depends on
                log.exception("a pod-added listener failed")

    def _watch_once(self, kind: str, generation: int, version: str) -> None:
        from kubernetes.client.exceptions import ApiException
        from kubernetes.watch.watch import iter_resp_lines

        fn = self._raw_list(kind)
        timeout = self.config.watch_timeout_s
        try:
            resp = fn(
                watch=True,
                resource_version=version,
                allow_watch_bookmarks=True,
                timeout_seconds=timeout,
                _preload_content=False,
                _request_timeout=(10, timeout + 30),
            )
        except ApiException as exc:
            if exc.status == 410 or self._absent(kind, exc):  # a full list says what is left
                raise _Gone(str(exc.reason)) from exc
            raise
        # stored before checking the flags, so stop() or a resync always finds it
        self._responses[kind] = resp
        try:
            with self._lock:
                if generation != self._generation or self._stop.is_set():
                    return
            for line in iter_resp_lines(resp):
                if not line:
                    continue
                event = orjson.loads(line)  # a whole pod per line: ~4x faster than the stdlib here
                etype, obj = event.get("type"), event.get("object") or {}
                if etype == "ERROR":
                    if obj.get("code") == 410:
                        raise _Gone(obj.get("message", ""))
                    if kind in (QUEUE, SLICE) and obj.get("code") == 404:  # the API gone: its objects too
                        raise _Gone(obj.get("message", ""))
                    raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
                new_version = (obj.get("metadata") or {}).get("resourceVersion")
                if etype != "BOOKMARK":
                    obj = slim(obj, kind)
                    if not self._unchanged(kind, etype, obj):
                        self._events.put((generation, (etype, obj)))
                    if etype == "ADDED" and kind == POD:
                        self._pod_added(obj)
                with self._lock:
                    if generation != self._generation:
                        return
                    if new_version:
                        self._resume_from[kind] = new_version
                if self._stop.is_set():
                    return
        finally:
            self._responses.pop(kind, None)
            resp.release_conn()
