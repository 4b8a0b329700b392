"""The eviction adapter: carries out the preemptions the ledger planned (gpuledger.service.preemption_orders).

Deciding is the ledger's: it plans the whole eviction and proves the preemptor then fits before handing out
an order. This module acts, in the order that keeps a crash harmless: first the plan's record is written on
the preemptor pod as the annotation `gpuledger.io/preempting` (a ledger rebuilt from the API objects keeps
the nodes for the same preemptor), then each victim is evicted through the Eviction API (which honours its
PodDisruptionBudgets and its termination grace), then Events tell the victim's owner and the preemptor why.

The cluster sync's forwarding thread, the only one that calls the ledger, calls `after_apply` right after
the placer's: it hands the ledger the evictions the API server refused (the ledger drops that plan and plans
again) and asks for the orders due, which this adapter's own thread carries out (API calls only). Each
victim is evicted once per process; an order handed out again after a restart is carried out again without
harm (a victim gone answers 404, an Event already posted 409).
"""

from __future__ import annotations

import contextlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from gpuledger.names import PREEMPTED_REASON, PREEMPTING_ANNOTATION, PREEMPTING_REASON
from gpuledger.service.preemption_orders import Eviction, EvictionRefused, PreemptionOrder
from gpuledger.sync.pod_events import object_event, once_name

if TYPE_CHECKING:
    from kubernetes.client import CoreV1Api

    from gpuledger.sync.targets import LedgerTarget

log = logging.getLogger("gpuledger.sync.evictor")

# what the Eviction API answers when it will not evict: 429 a PodDisruptionBudget allows no disruption now,
# 403 forbidden, 422 not allowed (e.g. the pod's namespace is terminating)
REFUSED_STATUSES = (403, 422, 429)
MERGE_PATCH = "application/merge-patch+json"
# a plan's victims are evicted this many at a time: a reclaim of thousands of pods is not one round trip
# after another, and the API server (and its PodDisruptionBudget checks) never sees more than this at once
PARALLEL_EVICTIONS = 8


@dataclass
class EvictorStats:
    evicted: int = 0  # victims the Eviction API accepted
    refused: int = 0  # victims it refused (handed to the ledger, which plans again)
    gone: int = 0  # victims already gone (404, or a new pod of the same name)
    void: int = 0  # orders whose preemptor was gone before its record was written: nothing done
    failed: int = 0  # calls that failed otherwise (carried out again when the order is handed out again)


def eviction_body(victim: Eviction) -> dict:
    """A policy/v1 Eviction of exactly this pod: a new pod of the same name is not evicted in its place."""
    return {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": victim.name, "namespace": victim.namespace},
        "deleteOptions": {"preconditions": {"uid": victim.uid}},
    }


def owner_of(pod: dict) -> dict:
    """The involvedObject of a victim's Event: the pod's controller (a Job, a ReplicaSet, a StatefulSet...)
    by its ownerReference, else the pod itself."""
    meta = pod.get("metadata") or {}
    namespace = str(meta.get("namespace", ""))
    for ref in meta.get("ownerReferences") or []:
        if isinstance(ref, dict) and ref.get("controller") and ref.get("kind") and ref.get("name"):
            return {
                "apiVersion": str(ref.get("apiVersion", "")),
                "kind": str(ref["kind"]),
                "namespace": namespace,
                "name": str(ref["name"]),
                "uid": str(ref.get("uid", "")),
            }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "namespace": namespace,
        "name": str(meta.get("name", "")),
        "uid": str(meta.get("uid", "")),
    }


def preempted_message(order: PreemptionOrder, victim: Eviction) -> str:
    return (
        f"pod {victim.name} evicted for pod {order.namespace}/{order.name} (rule {victim.rule}): {victim.why}"
    )


class Evictor:
    """Carries out the ledger's preemption orders on a thread of its own (API calls only). The cluster sync's
    forwarding thread calls `after_apply` after the placer's."""

    def __init__(
        self, core: CoreV1Api, clock: Callable[[], float] = time.time, parallel: int = PARALLEL_EVICTIONS
    ):
        self.core, self.clock = core, clock
        self.stats = EvictorStats()
        self.parallel = max(1, parallel)
        self._pool: ThreadPoolExecutor | None = None
        self._todo: queue.Queue[PreemptionOrder | None] = queue.Queue()
        self._lock = threading.Lock()
        self._queued: set[tuple[str, str]] = set()  # orders (id, record) queued and not yet carried out
        self._recorded: set[tuple[str, str]] = set()  # records written on their preemptor
        self._done: set[tuple[str, str]] = set()  # (order id, victim uid): evicted or found gone
        self._told: set[tuple[str, str]] = set()  # orders whose preemptor got its Event
        self._void: set[tuple[str, str]] = set()  # orders whose preemptor was gone: not tried again
        self._refused: list[EvictionRefused] = []
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ the forwarding thread's side
    def after_apply(self, target: LedgerTarget, holder: str) -> int:
        """Hand the ledger what the API server refused to evict, then ask for the orders due and queue those
        not carried out yet. Returns how many were queued."""
        with self._lock:
            refused, self._refused = self._refused, []
        if refused:
            target.eviction_refused(refused, holder)
        orders: list[PreemptionOrder] = list(target.preemptions_due(holder))
        queued = 0
        with self._lock:
            live = {o.id for o in orders}  # an order no longer due is done or void: forget it
            for remembered in (self._recorded, self._done, self._told, self._void):
                remembered.intersection_update({k for k in remembered if k[0] in live})
            for order in orders:
                key = (order.id, order.record)
                if key in self._queued or key in self._void or self._finished(order):
                    continue
                self._queued.add(key)
                self._todo.put(order)
                queued += 1
        return queued

    def _finished(self, order: PreemptionOrder) -> bool:
        return (order.id, order.record) in self._told and all(
            (order.id, v.uid) in self._done for v in order.victims
        )

    # ------------------------------------------------------------------ the evicting thread
    def start(self) -> Evictor:
        self._thread = threading.Thread(target=self._loop, name="gpuledger-evictor", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 5.0) -> None:
        self._todo.put(None)
        if self._thread is not None:
            self._thread.join(timeout)
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)

    def _loop(self) -> None:
        while True:
            order = self._todo.get()
            if order is None:
                self._todo.task_done()
                return
            try:
                self.carry_out(order)
            except Exception:  # the thread outlives any one order: it is handed out again at a later pass
                self._count("failed")
                log.exception("could not carry out the preemption for %s/%s", order.namespace, order.name)
            finally:
                with self._lock:
                    self._queued.discard((order.id, order.record))
                self._todo.task_done()

    def carry_out(self, order: PreemptionOrder) -> None:
        """Record the plan on the preemptor, evict each victim not evicted yet (its owner told of each), then
        tell the preemptor. Stops at the record when the preemptor is gone (the order is void)."""
        key = (order.id, order.record)
        if not order.recorded and key not in self._recorded and not self.record(order):
            return
        with self._lock:
            self._recorded.add(key)
        todo = [v for v in order.victims if (order.id, v.uid) not in self._done]
        for victim, outcome in zip(todo, self._each(lambda v: self.evict(order, v), todo), strict=True):
            if outcome in ("evicted", "gone"):
                with self._lock:
                    self._done.add((order.id, victim.uid))
        # the preemptor is told once every victim is evicted (a refused plan is dropped, a failure retried)
        if key not in self._told and all((order.id, v.uid) in self._done for v in order.victims):
            preemptor = {"apiVersion": "v1", "kind": "Pod", "namespace": order.namespace}
            preemptor.update(name=order.name, uid=order.uid)
            name = once_name(order.name, "preempting", order.id, order.record)
            if self._post(
                object_event(preemptor, PREEMPTING_REASON, order.message, self.clock(), False, name)
            ):
                with self._lock:
                    self._told.add(key)

    def _each(self, evict: Callable[[Eviction], str], victims: list[Eviction]) -> list[str]:
        """`evict` of each victim, `parallel` at a time (in their order when one at a time)."""
        if self.parallel == 1 or len(victims) <= 1:
            return [evict(v) for v in victims]
        if self._pool is None:
            self._pool = ThreadPoolExecutor(self.parallel, thread_name_prefix="gpuledger-evict")
        return list(self._pool.map(evict, victims))

    def _count(self, outcome: str) -> None:
        with self._lock:
            setattr(self.stats, outcome, getattr(self.stats, outcome) + 1)

    def record(self, order: PreemptionOrder) -> bool:
        """Write the plan's record on the preemptor (a merge patch whose uid must match). False when the
        preemptor is gone or replaced (the order is void) or the write failed (tried again later)."""
        from kubernetes.client.exceptions import ApiException

        body = {"metadata": {"uid": order.uid, "annotations": {PREEMPTING_ANNOTATION: order.record}}}
        try:
            self.core.patch_namespaced_pod(
                order.name, order.namespace, body, _content_type=MERGE_PATCH, _preload_content=False
            )
        except ApiException as exc:
            # 404 gone; 422 (uid "field is immutable") or 409: a new pod of the name, not the preemptor
            if exc.status in (404, 409, 422):
                self._count("void")
                with self._lock:
                    self._void.add((order.id, order.record))
                log.info("preemptor %s/%s is gone: its preemption is void", order.namespace, order.name)
            else:
                self._count("failed")
                log.warning(
                    "could not write %s on %s/%s: %s %s",
                    PREEMPTING_ANNOTATION,
                    order.namespace,
                    order.name,
                    exc.status,
                    exc.reason,
                )
            return False
        return True

    def evict(self, order: PreemptionOrder, victim: Eviction) -> str:
        """Evict one victim: "evicted", "gone", "refused" (handed to the ledger at the next pass) or
        "failed". Its owner gets a Warning Event naming the preemptor, the rule and why."""
        from kubernetes.client.exceptions import ApiException

        who = f"{victim.namespace}/{victim.name}"
        try:
            pod = _body(self.core.read_namespaced_pod(victim.name, victim.namespace, _preload_content=False))
            if (pod.get("metadata") or {}).get("uid") != victim.uid:
                self._count("gone")
                return "gone"
            self.core.create_namespaced_pod_eviction(
                victim.name,
                victim.namespace,
                eviction_body(victim),  # type: ignore[arg-type]  # a plain dict body is sent as is
                _preload_content=False,
            )
        except ApiException as exc:
            if exc.status in (404, 409):  # deleted, or another pod of the name now (the uid precondition)
                self._count("gone")
                return "gone"
            if exc.status in REFUSED_STATUSES:
                self._count("refused")
                message = _status_message(exc)
                log.info("eviction of %s refused: %s %s", who, exc.status, message)
                with self._lock:
                    self._refused.append(
                        EvictionRefused(
                            order.id, victim.namespace, victim.name, victim.uid, int(exc.status), message
                        )
                    )
                return "refused"
            self._count("failed")
            log.warning("could not evict %s: %s %s", who, exc.status, exc.reason)
            return "failed"
        self._count("evicted")
        log.info("evicted %s for %s/%s (%s)", who, order.namespace, order.name, victim.rule)
        name = once_name(victim.name, "preempted", order.id, victim.uid)
        message = preempted_message(order, victim)
        self._post(object_event(owner_of(pod), PREEMPTED_REASON, message, self.clock(), True, name))
        return "evicted"

    def _post(self, event: dict) -> bool:
        """Post an Event; True when it is there (posted now, or already: 409). A courtesy: never raises."""
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.create_namespaced_event(event["metadata"]["namespace"], event)  # type: ignore[arg-type]
        except ApiException as exc:
            if exc.status == 409:
                return True
            log.warning("could not post %s Event: %s %s", event["reason"], exc.status, exc.reason)
            return False
        except Exception as exc:  # noqa: BLE001 - an Event is a courtesy: never let it stop the evictor
            log.warning("could not post %s Event: %r", event["reason"], exc)
            return False
        return True

    def drain(self, timeout: float = 10.0) -> bool:
        """Wait until every queued order was carried out or failed (tests)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._todo.unfinished_tasks == 0:
                return True
            time.sleep(0.01)
        return False


def _body(response: Any) -> dict:
    """The JSON of a raw response (`_preload_content=False`)."""
    return json.loads(response.data)


def _status_message(exc: Any) -> str:
    """The API server's own words from an error's Status body (e.g. which disruption budget)."""
    with contextlib.suppress(Exception):
        return str(json.loads(exc.body).get("message") or exc.reason)
    return str(exc.reason)
