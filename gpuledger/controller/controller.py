"""The reconcile engine: caches what the watches report, and on each wake runs one serialized pass.

A pass steps every GPUWorkload (gpuledger.controller.lifecycle), then the queue, then refreshes the GPUNodes.
The queue starts at once every Queued workload whose pods wait when full (the default, `when_full`): its Job
is created and its pods are placed now or wait, gated, in the ledger's one line with every other pod, in
priority then arrival order; the workload shows its first waiting pod's place in that line (read from the
gated pods' tickets). A workload whose pods are refused when full waits in the controller's own queue
(gpuledger.controller.queue, asking the ledger in one dry-run call) until the ledger can place it whole.
Wakes come from watch events (a pod freeing a GPU or moving in the line wakes the queue at once) and from
timers set for the next retry, deadline or placing timeout: there is no polling interval. Only the leader
runs it (gpuledger.controller.leader). Time and randomness are injected.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from gpuledger.controller import gpunodes, lifecycle
from gpuledger.controller.kube import Conflict, KubeWriter
from gpuledger.controller.ledger import INVALID, LedgerView
from gpuledger.controller.lifecycle import TERMINAL, Observed, in_line
from gpuledger.controller.mapping import (
    SpecError,
    WorkloadKey,
    WorkloadRequest,
    from_object,
    job_manifest,
    parse_time,
    when_full,
)
from gpuledger.controller.metrics import ControllerMetrics, priority_band
from gpuledger.controller.queue import DEFAULT_BACKFILL_WINDOW_S, Entry, Verdict, plan
from gpuledger.names import (
    ADMISSION_ENABLED,
    ADMISSION_LABEL,
    RESERVATION_ID_KEY,
    SCHEDULING_GATE,
    WAITING_ANNOTATION,
    WHEN_FULL_REFUSE,
    WHEN_FULL_WAIT,
    WORKLOAD_UID_LABEL,
)
from gpuledger.views.workloads import waiting_tickets

log = logging.getLogger("gpuledger.controller")


@dataclass(frozen=True)
class EngineSettings:
    backfill_window_s: float = DEFAULT_BACKFILL_WINDOW_S
    placing_timeout_s: float = lifecycle.DEFAULT_PLACING_TIMEOUT_S
    gpunode_interval_s: float = 5.0  # at most one GPUNode refresh per this many seconds of events
    free_wait_s: float = 10.0  # how long a freed reservation is watched for its release by the sync
    # while workloads wait: look again this often, for capacity freed with no API event (a reservation made
    # for a pod that was never stored expires after the ledger's TTL). Events still wake the queue at once.
    requeue_interval_s: float = 15.0
    gpunodes: bool = True
    # a workload without the annotation topology.scheduler/when-full: wait (its pods wait in the ledger's
    # line) or refuse (it waits in the controller's queue); the webhook's when_full, which defaults to wait
    when_full: str = WHEN_FULL_WAIT


def _waiting_in_line(pod: Mapping) -> bool:
    """Gated by gpuledger and holding a ticket: a pod in the ledger's line."""
    meta, spec = pod.get("metadata") or {}, pod.get("spec") or {}
    gates = spec.get("schedulingGates") or []
    return WAITING_ANNOTATION in (meta.get("annotations") or {}) and any(
        isinstance(g, dict) and g.get("name") == SCHEDULING_GATE for g in gates
    )


def _rv(obj: Mapping) -> int:
    try:
        return int((obj.get("metadata") or {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


def workload_key(obj: Mapping) -> WorkloadKey:
    meta = obj.get("metadata") or {}
    return WorkloadKey(
        str(obj.get("apiVersion", "")).partition("/")[0], meta.get("namespace", ""), meta["name"]
    )


class NotLeader(Exception):
    """This replica's Lease went stale: it must not write until it has renewed it."""


class Engine:
    def __init__(
        self,
        writer: KubeWriter,
        ledger: LedgerView,
        metrics: ControllerMetrics | None = None,
        settings: EngineSettings = EngineSettings(),
        clock: Callable[[], float] = time.time,
        draw: Callable[[], float] = random.random,
        may_act: Callable[[], bool] = lambda: True,
    ):
        self.writer, self.ledger, self.settings = writer, ledger, settings
        self.may_act = may_act  # the leader's Lease is still fresh (gpuledger.controller.leader)
        self.metrics = metrics or ControllerMetrics()
        self.clock, self.draw = clock, draw
        self.workloads: dict[WorkloadKey, dict] = {}
        self.jobs: dict[tuple[str, str], dict] = {}
        self.pods: dict[tuple[str, str], dict] = {}  # the controller's pods (WORKLOAD_UID_LABEL)
        self.waiting_pods: dict[tuple[str, str], dict] = {}  # every pod in the ledger's line, any owner
        self.nodes: dict[str, dict] = {}
        self.namespaces: dict[str, bool] = {}
        self.reservation_pods: dict[str, str] = {}  # reservation id -> namespace/name, for GPUNode holders
        self.freeing: dict[str, float] = {}  # reservation id -> give up waiting for its release at
        self._wake = asyncio.Event()
        self._timer: asyncio.TimerHandle | None = None
        self._last_gpunodes = 0.0
        self.gpunode_status: dict[str, dict] = {}
        self.passes = 0

    # ---------------------------------------------------------------- events (from the watches)
    def wake(self) -> None:
        self._wake.set()

    def observe_workload(self, kind: str | None, obj: dict) -> None:
        key = workload_key(obj)
        if kind == "DELETED":
            self.workloads.pop(key, None)
        elif key not in self.workloads or _rv(obj) >= _rv(self.workloads[key]):
            self.workloads[key] = obj
        self.wake()

    def observe_job(self, kind: str | None, obj: dict) -> None:
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        if kind == "DELETED":
            self.jobs.pop(key, None)
        else:
            self.jobs[key] = obj
        self.wake()

    def observe_pod(self, kind: str | None, obj: dict) -> None:
        meta = obj["metadata"]
        labels = meta.get("labels") or {}
        rid = labels.get(RESERVATION_ID_KEY)
        gone = kind == "DELETED" or (obj.get("status") or {}).get("phase") in TERMINAL
        if rid:
            if gone:
                if self.reservation_pods.pop(rid, None) is not None or kind == "DELETED":
                    self.freeing[rid] = self.clock() + self.settings.free_wait_s
            else:
                self.reservation_pods[rid] = f"{meta['namespace']}/{meta['name']}"
        key = (meta["namespace"], meta["name"])
        if WORKLOAD_UID_LABEL in labels:
            if kind == "DELETED":
                self.pods.pop(key, None)
            else:
                self.pods[key] = obj
        line_moved = False
        if kind != "DELETED" and _waiting_in_line(obj):
            line_moved = key not in self.waiting_pods
            self.waiting_pods[key] = obj
        else:
            line_moved = self.waiting_pods.pop(key, None) is not None
        if rid or WORKLOAD_UID_LABEL in labels or (line_moved and self._any_in_line()):
            self.wake()

    def _any_in_line(self) -> bool:
        """Whether a workload shows a place in the ledger's line (a pod joining or leaving it moves it)."""
        return any(in_line(obj.get("status") or {}) for obj in self.workloads.values())

    def observe_node(self, kind: str | None, obj: dict) -> None:
        name = obj["metadata"]["name"]
        if kind == "DELETED":
            self.nodes.pop(name, None)
        else:
            self.nodes[name] = obj
        self.wake()

    def observe_namespace(self, kind: str | None, obj: dict) -> None:
        name = obj["metadata"]["name"]
        labels = obj["metadata"].get("labels") or {}
        self.namespaces[name] = kind != "DELETED" and labels.get(ADMISSION_LABEL) == ADMISSION_ENABLED
        self.wake()

    # ---------------------------------------------------------------- the loop
    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            waker = asyncio.ensure_future(self._wake.wait())
            stopper = asyncio.ensure_future(stop.wait())
            await asyncio.wait({waker, stopper}, return_when=asyncio.FIRST_COMPLETED)
            waker.cancel()
            stopper.cancel()
            if stop.is_set():
                return
            self._wake.clear()
            try:
                await self.pass_once()
            except NotLeader:
                log.warning("the Lease is not fresh: not acting until it is renewed")
                self._wake_in(1.0)
            except Exception:
                log.exception("reconcile pass failed; again in 1s")
                self._wake_in(1.0)

    async def pass_once(self) -> None:
        started = time.perf_counter()
        now = self.clock()
        self.passes += 1
        await self._settle_freeing(now)
        line = {key: place for key, (place, _) in waiting_tickets(list(self.waiting_pods.values())).items()}
        for key in list(self.workloads):
            obj = self.workloads.get(key)
            if obj is not None:
                try:
                    await self._reconcile(obj, now, line)
                except Conflict as err:
                    log.info("conflict on %s (%s): re-reading", key, err)
                    await self._refresh(obj)
        await self._queue_pass(now)
        if self.settings.gpunodes:
            await self._refresh_gpunodes(now)
        self._arm_timer(now)
        self.metrics.reconcile.observe(time.perf_counter() - started)

    # ---------------------------------------------------------------- one workload
    def _guard(self) -> None:
        if not self.may_act():
            raise NotLeader()

    async def _write(self, obj: dict, status: dict) -> dict:
        self._guard()
        new = await asyncio.to_thread(self.writer.write_status, obj, status)
        key = workload_key(obj)
        if key in self.workloads and _rv(new) >= _rv(self.workloads[key]):
            self.workloads[key] = new
        return new

    async def _refresh(self, obj: dict) -> None:
        fresh = await asyncio.to_thread(self.writer.get_workload, obj)
        key = workload_key(obj)
        if fresh is None:
            self.workloads.pop(key, None)
        else:
            self.observe_workload("MODIFIED", fresh)

    async def _job(self, namespace: str, name: str | None) -> dict | None:
        if not name:
            return None
        job = self.jobs.get((namespace, name))
        if job is None:  # not seen yet (a restart's first pass): ask, do not guess
            job = await asyncio.to_thread(self.writer.read_job, namespace, name)
            if job is not None:
                self.jobs[(namespace, name)] = job
        return job

    async def _namespace_enabled(self, name: str) -> bool:
        if name not in self.namespaces:
            ns = await asyncio.to_thread(self.writer.read_namespace, name)
            labels = ((ns or {}).get("metadata") or {}).get("labels") or {}
            self.namespaces[name] = labels.get(ADMISSION_LABEL) == ADMISSION_ENABLED
        return self.namespaces[name]

    async def _lost_nodes(self, names: list[str]) -> frozenset[str]:
        lost = set()
        for name in names:
            if name not in self.nodes and await asyncio.to_thread(self.writer.read_node, name) is None:
                lost.add(name)
        return frozenset(lost)

    def _pods_of(self, namespace: str, job: str | None) -> list[dict]:
        return [
            p
            for (ns, _), p in self.pods.items()
            if ns == namespace and (p["metadata"].get("labels") or {}).get("job-name") == job
        ]

    async def _reconcile(self, obj: dict, now: float, line: Mapping[tuple[str, str], int]) -> None:
        status = dict(obj.get("status") or {})
        try:
            req = from_object(obj)
            when_full(obj, self.settings.when_full)
        except SpecError as err:
            if status.get("phase") not in TERMINAL:
                await self._write(obj, lifecycle.with_phase(status, "Failed", "InvalidSpec", str(err), now))
                self.metrics.count(["failed:InvalidSpec"])
            return
        ns = req.key.namespace
        job = await self._job(ns, status.get("jobName")) if status.get("phase") not in TERMINAL else None
        pods = self._pods_of(ns, status.get("jobName"))
        placed_nodes = {p["node"] for p in lifecycle.placements(pods)} | set(
            status.get("assignedNodes") or []
        )
        seen = Observed(
            job,
            pods,
            await self._lost_nodes(sorted(placed_nodes)),
            await self._namespace_enabled(ns),
            in_line={_pod_key(p)[1]: line[_pod_key(p)] for p in pods if _pod_key(p) in line},
        )
        step = lifecycle.step(req, status, seen, now, self.draw(), self.settings.placing_timeout_s)
        if step.delete_job:
            self._guard()
            await asyncio.to_thread(self.writer.delete_job, ns, step.delete_job)
            self.jobs.pop((ns, step.delete_job), None)
        if step.create_job:
            await self._create_job(req, step.status, now, when_full(obj, self.settings.when_full))
        if step.status != status:
            await self._write(obj, step.status)
        self.metrics.count(step.events)

    async def _create_job(self, req: WorkloadRequest, status: Mapping, now: float, word: str) -> None:
        left = None if req.deadline_s is None else int(req.created + req.deadline_s - now)
        job = job_manifest(req, int(status.get("attempts") or 1), left, word)
        self._guard()
        created = await asyncio.to_thread(self.writer.create_job, job)
        log.info(
            "%s Job %s/%s for %s",
            "created" if created else "found existing",
            req.key.namespace,
            job["metadata"]["name"],
            req.key,
        )

    # ---------------------------------------------------------------- the queue
    async def _queue_pass(self, now: float) -> None:
        queued: list[tuple[dict, WorkloadRequest]] = []
        waits: list[tuple[dict, WorkloadRequest]] = []
        priorities: list[int] = []
        placing = False
        for obj in list(self.workloads.values()):
            status = obj.get("status") or {}
            phase = status.get("phase")
            placing |= phase == "Placing"
            if phase == "Queued":
                try:
                    req = from_object(obj)
                    word = when_full(obj, self.settings.when_full)
                except SpecError:
                    continue
                priorities.append(req.priority)
                if in_line(status):
                    continue  # its pods wait in the ledger's line: the ledger places them
                (waits if word == WHEN_FULL_WAIT else queued).append((obj, req))
        self.metrics.set_queue(priorities)
        for obj, req in waits:  # no queue of the controller's own: their pods join the ledger's line now
            await self._start(obj, req, now, WHEN_FULL_WAIT)
        if not queued:
            return
        entries = [Entry(req.key, req.priority, req.created, req.total_gpus) for _, req in queued]
        if placing:
            # one workload is placed at a time: a dry run now would count GPUs the placing one will take
            verdicts = {req.key: _previous(obj) for obj, req in queued}
        else:
            jobs = [
                job_manifest(req, int((obj.get("status") or {}).get("attempts") or 0) + 1)
                for obj, req in queued
            ]
            answers = await asyncio.to_thread(self.ledger.dry_run, jobs)
            verdicts = {req.key: v for (_, req), v in zip(queued, answers, strict=True)}
        decided = plan(entries, verdicts, now, self.settings.backfill_window_s)
        log.debug(
            "queue pass: placing=%s verdicts=%s start=%s",
            placing,
            {str(k): (v.fits, v.reason) for k, v in verdicts.items()},
            decided.start,
        )
        by_key = {req.key: (obj, req) for obj, req in queued}
        if decided.start is not None:
            obj, req = by_key[decided.start]
            if not await self._start(obj, req, now, WHEN_FULL_REFUSE):
                return
            queued_at = parse_time((obj.get("status") or {}).get("queuedTime")) or req.created
            self.metrics.queue_wait.labels(priority=priority_band(req.priority)).observe(
                max(0.0, now - queued_at)
            )
        for key, verdict in decided.waiting.items():
            obj, req = by_key[key]
            status = obj.get("status") or {}
            if verdict.reason == INVALID:
                await self._write(obj, lifecycle.with_phase(status, "Failed", INVALID, verdict.message, now))
                self.metrics.count([f"failed:{INVALID}"])
                continue
            new = lifecycle.queued(
                status,
                decided.positions[key],
                verdict.reason or status.get("reason", "Queued"),
                verdict.message or status.get("message", ""),
                now,
            )
            if new != status:
                try:
                    await self._write(obj, new)
                except Conflict:
                    await self._refresh(obj)

    async def _start(self, obj: dict, req: WorkloadRequest, now: float, word: str) -> bool:
        """Queued -> Placing, then its Job: counted and named first, so a restart re-creates, never doubles.
        False when the status write lost a race (re-read; a pass comes again)."""
        status = lifecycle.start_attempt(req, obj.get("status") or {}, now, waits=word == WHEN_FULL_WAIT)
        try:
            await self._write(obj, status)
        except Conflict:
            await self._refresh(obj)
            self.wake()
            return False
        await self._create_job(req, status, now, word)
        return True

    # ---------------------------------------------------------------- freed GPUs, timers, GPUNodes
    async def _settle_freeing(self, now: float) -> None:
        """Freed reservations the sync has not released yet: look again shortly (bounded), so the queue's dry
        run sees the GPU free. Woken by the pod's event, not by a polling interval."""
        self.freeing = {rid: until for rid, until in self.freeing.items() if until > now}
        if not self.freeing:
            return
        ids = list(self.freeing)
        held = await asyncio.to_thread(self.ledger.held, ids)
        log.debug("freeing %s: held %s", ids, held)
        for rid, still in zip(ids, held, strict=True):
            if not still:
                self.freeing.pop(rid, None)
        if self.freeing:
            self._wake_in(0.2)

    def _wake_in(self, delay: float) -> None:
        loop = asyncio.get_running_loop()
        when = loop.time() + max(0.0, delay)
        pending = self._timer is not None and not self._timer.cancelled() and self._timer.when() > loop.time()
        if pending and self._timer is not None and self._timer.when() <= when:
            return  # an earlier wake is already set
        if self._timer is not None:
            self._timer.cancel()
        self._timer = loop.call_at(when, self.wake)

    def _arm_timer(self, now: float) -> None:
        """The next moment a workload changes without an event: a retry, a deadline, a placing timeout."""
        moments = []
        for obj in self.workloads.values():
            status = obj.get("status") or {}
            phase = status.get("phase")
            if phase == "Retrying" and status.get("nextRetryTime"):
                moments.append(parse_time(status["nextRetryTime"]))
            elif phase == "Placing" and status.get("startTime"):
                moments.append(parse_time(status["startTime"]) + self.settings.placing_timeout_s)
            deadline = (obj.get("spec") or {}).get("activeDeadlineSeconds")
            if phase not in TERMINAL and isinstance(deadline, int):
                moments.append(parse_time(obj["metadata"].get("creationTimestamp")) + deadline)
            if phase == "Queued" and self.settings.requeue_interval_s > 0:
                moments.append(now + self.settings.requeue_interval_s)
        future = [m for m in moments if m > now - 1]
        if future:
            self._wake_in(min(future) - now + 0.05)

    async def _refresh_gpunodes(self, now: float) -> None:
        if now - self._last_gpunodes < self.settings.gpunode_interval_s:
            self._wake_in(self._last_gpunodes + self.settings.gpunode_interval_s - now)
            return
        self._last_gpunodes = now
        snapshot = await asyncio.to_thread(self.ledger.snapshot)
        wanted = gpunodes.statuses(snapshot, self.nodes, self.reservation_pods, now)
        for name, status in wanted.items():
            old = self.gpunode_status.get(name)
            if not gpunodes.same(old, status):
                self._guard()
                await asyncio.to_thread(self.writer.write_gpunode, name, status, old)
                self.gpunode_status[name] = status
        for name in set(self.gpunode_status) - set(wanted):
            await asyncio.to_thread(self.writer.delete_gpunode, name)
            self.gpunode_status.pop(name, None)


def _pod_key(pod: Mapping) -> tuple[str, str]:
    meta = pod.get("metadata") or {}
    return (meta.get("namespace", ""), meta.get("name", ""))


def _previous(obj: Mapping) -> Verdict:
    status = obj.get("status") or {}
    return Verdict(False, status.get("reason") or "Queued", status.get("message") or "")
