"""One GPUWorkload's next status from what is stored (its status, its Job, its pods, the nodes). Pure.

Every transition except Queued -> Placing (the controller's: at once where the workload's pods wait in the
ledger's line, after the queue's dry run where they are refused when full) is decided here, with `now` and
the backoff's random draw as arguments, so a restarted controller reaches the same answer from the same
objects. It never talks to the API: it says which Job to create or delete and the status to write.

A workload whose pods wait in the ledger's line (gated by the webhook, each with a ticket) is shown Queued,
reason IN_LINE, with its first waiting pod's place in that one line; its Job exists, so it is stepped as an
attempt, and it becomes Running once the ledger has placed every pod.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuledger.controller import backoff
from gpuledger.controller.mapping import WorkloadRequest, format_time, job_name, parse_time
from gpuledger.names import ADMISSION_ENABLED, ADMISSION_LABEL, PLACEMENT_ANNOTATION

TERMINAL = ("Succeeded", "Failed")
DEFAULT_PLACING_TIMEOUT_S = 60.0
IN_LINE = "WaitingInLine"  # the reason of a Queued workload whose pods wait in the ledger's line


@dataclass(frozen=True)
class Observed:
    """What the API holds for the current attempt."""

    job: Mapping[str, Any] | None = None
    pods: Sequence[Mapping[str, Any]] = ()
    lost_nodes: frozenset[str] = frozenset()  # assigned nodes that are gone from the API
    namespace_enabled: bool = True
    in_line: Mapping[str, int] = field(default_factory=dict)  # pod name -> its place in the ledger's line


@dataclass(frozen=True)
class Step:
    status: dict[str, Any]  # the whole new status (unchanged: equal to the old one)
    create_job: bool = False
    delete_job: str | None = None
    events: tuple[str, ...] = field(default=())  # what happened, for metrics: scheduled, retried, failed:<r>


def condition(status: Mapping, type_: str, value: bool, reason: str, message: str, now: float) -> list[dict]:
    """Conditions with `type_` set; lastTransitionTime moves only when the value changes."""
    out, state = [], "True" if value else "False"
    found = False
    for c in status.get("conditions") or []:
        if c.get("type") == type_:
            found = True
            when = c.get("lastTransitionTime") if c.get("status") == state else format_time(now)
            c = {
                "type": type_,
                "status": state,
                "reason": reason,
                "message": message[:1000],
                "lastTransitionTime": when or format_time(now),
            }
        out.append(c)
    if not found:
        out.append(
            {
                "type": type_,
                "status": state,
                "reason": reason,
                "message": message[:1000],
                "lastTransitionTime": format_time(now),
            }
        )
    return out


def with_phase(status: Mapping, phase: str, reason: str, message: str, now: float, **fields: Any) -> dict:
    new = {k: v for k, v in status.items() if k not in ("queuePosition", "nextRetryTime")}
    new.update(phase=phase, reason=reason, message=message[:1000], **fields)
    new = {k: v for k, v in new.items() if v is not None}
    new["conditions"] = condition(new, "Running", phase == "Running", reason, message, now)
    new["conditions"] = condition(new, "Queued", phase == "Queued", reason, message, now)
    if phase in TERMINAL:
        new["conditions"] = condition(new, "Complete", phase == "Succeeded", reason, message, now)
    return new


def _job_condition(job: Mapping | None, type_: str) -> Mapping | None:
    for c in ((job or {}).get("status") or {}).get("conditions") or []:
        if c.get("type") == type_ and c.get("status") == "True":
            return c
    return None


def placements(pods: Sequence[Mapping]) -> list[dict]:
    """Per placed pod: name, node, device indices, UUIDs (read from the webhook's annotation, never written
    here, and unverified: the status only reports it)."""
    out = []
    for pod in pods:
        text = ((pod.get("metadata") or {}).get("annotations") or {}).get(PLACEMENT_ANNOTATION)
        if not text:
            continue
        try:
            p = json.loads(text)
        except ValueError:
            continue
        entry: dict[str, Any] = {
            "pod": pod["metadata"].get("name", ""),
            "node": str(p.get("node", "")),
            "indices": [int(d) for d in p.get("devices") or []],
        }
        if p.get("uuids"):
            entry["uuids"] = [str(u) for u in p["uuids"]]
        if p.get("shares"):
            entry["indices"] = sorted({int(s[0]) for s in p["shares"]})
            entry["milli"] = sum(int(s[1]) for s in p["shares"])
            entry["memoryMiB"] = sum(int(s[2]) for s in p["shares"])
        out.append(entry)
    return sorted(out, key=lambda e: e["pod"])


def retry_or_fail(
    req: WorkloadRequest, status: Mapping, reason: str, message: str, now: float, draw: float
) -> dict:
    """Retrying with the next backoff while retries are left, else Failed with the same reason."""
    attempts = int(status.get("attempts") or 0)
    if attempts - 1 < req.retry.max_retries:
        when = backoff.next_retry_time(
            now, max(1, attempts), draw, req.retry.backoff_s, req.retry.max_backoff_s
        )
        new = with_phase(
            status,
            "Retrying",
            reason,
            f"{message}; retry {attempts} of {req.retry.max_retries} at {format_time(when)}",
            now,
        )
        new["nextRetryTime"] = format_time(when)
        return new
    return with_phase(
        status,
        "Failed",
        reason,
        f"{message}; no retries left ({req.retry.max_retries} allowed)",
        now,
        completionTime=format_time(now),
    )


def step(
    req: WorkloadRequest,
    status: Mapping[str, Any],
    seen: Observed,
    now: float,
    draw: float,
    placing_timeout_s: float = DEFAULT_PLACING_TIMEOUT_S,
) -> Step:
    """The next status and Job actions for every phase but the queue's own decision: first what stops a
    workload in any phase (its deadline, spec.suspend, a namespace not opted in), then its phase's rule."""
    status = dict(status or {})
    phase = status.get("phase") or "Pending"
    if phase in TERMINAL:
        return Step(status)
    stopped = _stopped(req, status, phase, seen, now)
    if stopped is not None:
        return stopped
    if phase in ("Pending", "Retrying") or (phase == "Queued" and not in_line(status)):
        return _waiting(status, phase, now)
    return _attempt(req, status, phase, seen, now, draw, placing_timeout_s)  # Placing, in line or Running


def in_line(status: Mapping[str, Any]) -> bool:
    """Whether a Queued workload's Job exists and its pods wait in the ledger's line."""
    return status.get("phase") == "Queued" and status.get("reason") == IN_LINE


def _stopped(req: WorkloadRequest, status: dict, phase: str, seen: Observed, now: float) -> Step | None:
    """Failed at its deadline, Pending while suspended or while its namespace is not opted in; else None."""
    current_job = status.get("jobName")
    has_job = seen.job is not None
    if req.deadline_s is not None and now >= req.created + req.deadline_s:
        new = with_phase(
            status,
            "Failed",
            "DeadlineExceeded",
            f"spec.activeDeadlineSeconds={req.deadline_s} passed before the workload finished",
            now,
            completionTime=format_time(now),
        )
        return Step(new, delete_job=current_job if has_job else None, events=("failed:DeadlineExceeded",))
    if req.suspend:
        if phase == "Pending" and status.get("reason") == "Suspended" and not has_job:
            return Step(status)
        new = with_phase(
            status,
            "Pending",
            "Suspended",
            "spec.suspend is true: not queued, GPUs released",
            now,
            assignedNodes=[],
            devices=[],
        )
        return Step(new, delete_job=current_job if has_job else None)
    if not seen.namespace_enabled:
        message = (
            f"namespace {req.key.namespace} is not labelled {ADMISSION_LABEL}={ADMISSION_ENABLED}: its pods "
            "would not be placed by gpuledger"
        )
        if phase == "Pending" and status.get("reason") == "NamespaceNotEnabled":
            return Step(status)
        return Step(with_phase(status, "Pending", "NamespaceNotEnabled", message, now))
    return None


def _waiting(status: dict, phase: str, now: float) -> Step:
    """Pending -> Queued; Retrying -> Queued once its backoff is over; Queued stays for the queue to move."""
    if phase == "Pending":
        return Step(
            with_phase(
                status,
                "Queued",
                "Queued",
                "waiting for the queue's first pass",
                now,
                queuedTime=status.get("queuedTime") or format_time(now),
            )
        )
    if phase == "Retrying" and now >= parse_time(status.get("nextRetryTime")):
        return Step(with_phase(status, "Queued", "Retry", "back in the queue after a backoff", now))
    return Step(status)


def _attempt(
    req: WorkloadRequest,
    status: dict,
    phase: str,
    seen: Observed,
    now: float,
    draw: float,
    placing_timeout_s: float,
) -> Step:
    """Placing, in line or Running, by the current attempt's Job and pods: its Job (re)created, its end, a
    node lost, its pods placed in time, waiting in line or not, the placements recorded."""
    current_job = status.get("jobName")
    if seen.job is None:
        if phase in ("Placing", "Queued"):
            return Step(status, create_job=True)  # the status was written, the Job not yet (or it was lost)
        new = retry_or_fail(req, status, "JobLost", f"Job {current_job} is gone", now, draw)
        return Step(new, events=_events(new))
    ended = _ended(req, status, seen, now, draw)
    if ended is not None:
        return ended
    placed = placements([p for p in seen.pods if (p.get("status") or {}).get("phase") != "Failed"])
    nodes = sorted({p["node"] for p in placed})
    lost = sorted(seen.lost_nodes & set(nodes))
    if lost:
        new = retry_or_fail(req, status, "NodeLost", f"node(s) {', '.join(lost)} left the cluster", now, draw)
        return Step(new, delete_job=current_job, events=_events(new))
    if phase in ("Placing", "Queued"):
        return _placing(req, status, seen, placed, nodes, now, draw, placing_timeout_s)
    if placed and (placed != status.get("devices") or nodes != status.get("assignedNodes")):
        return Step({**status, "devices": placed, "assignedNodes": nodes})
    return Step(status)


def _ended(req: WorkloadRequest, status: dict, seen: Observed, now: float, draw: float) -> Step | None:
    """The attempt's end, if its Job says so: failed at the Job's deadline, a pod failed (retried or failed by
    retry_or_fail), or every pod succeeded; None while it runs."""
    current_job = status.get("jobName")
    failed = _job_condition(seen.job, "Failed")
    failed_pods = [p for p in seen.pods if (p.get("status") or {}).get("phase") == "Failed"]
    if failed is not None and failed.get("reason") == "DeadlineExceeded":
        new = with_phase(
            status,
            "Failed",
            "DeadlineExceeded",
            "the Job passed its activeDeadlineSeconds",
            now,
            completionTime=format_time(now),
        )
        return Step(new, delete_job=current_job, events=("failed:DeadlineExceeded",))
    if failed is not None or failed_pods:
        names = ", ".join(sorted(p["metadata"]["name"] for p in failed_pods)) or current_job
        new = retry_or_fail(req, status, "PodFailed", f"pod(s) failed: {names}", now, draw)
        return Step(new, delete_job=current_job, events=_events(new))
    if (
        _job_condition(seen.job, "Complete") is not None
        or int(((seen.job or {}).get("status") or {}).get("succeeded") or 0) >= req.parallelism
    ):
        new = with_phase(
            status,
            "Succeeded",
            "Completed",
            f"all {req.parallelism} pod(s) succeeded",
            now,
            completionTime=format_time(now),
        )
        return Step(new, events=("succeeded",))
    return None


def _placing(
    req: WorkloadRequest,
    status: dict,
    seen: Observed,
    placed: list[dict],
    nodes: list[str],
    now: float,
    draw: float,
    placing_timeout_s: float,
) -> Step:
    """Running once every pod is placed; Queued in line while every pod is placed or waiting in the ledger's
    line; retried (or failed) when they are neither within the timeout."""
    if len(placed) >= req.parallelism:
        new = with_phase(
            status,
            "Running",
            "Placed",
            f"{len(placed)} pod(s) placed on {', '.join(nodes)}",
            now,
            assignedNodes=nodes,
            devices=placed,
        )
        return Step(new, events=(f"scheduled:{req.strategy_label}",))
    live = [p for p in seen.pods if (p.get("status") or {}).get("phase") != "Failed"]
    names = {p["metadata"].get("name", "") for p in live}
    waiting = sorted((seen.in_line[n], n) for n in names if n in seen.in_line)
    placed_names = {p["pod"] for p in placed}
    if waiting and len(live) >= req.parallelism and names <= placed_names | {n for _, n in waiting}:
        message = (
            f"{len(waiting)} of {req.parallelism} pod(s) of Job {status.get('jobName')} wait in the ledger's "
            f"line for GPUs (the first is {_ordinal(waiting[0][0])} in line); placed when GPUs free"
        )
        return Step(queued(status, waiting[0][0], IN_LINE, message, now))
    if in_line(status):
        return Step(status)  # a pod of the Job is being replaced: it joins the line again, no timeout
    if now - parse_time(status.get("startTime")) >= placing_timeout_s:
        new = retry_or_fail(
            req,
            status,
            "PlacementDenied",
            f"{len(placed)} of {req.parallelism} pod(s) placed within {placing_timeout_s:g}s "
            "(the webhook denied them: the GPUs were taken after the dry run)",
            now,
            draw,
        )
        return Step(new, delete_job=status.get("jobName"), events=_events(new))
    return Step(status)


def _events(status: Mapping) -> tuple[str, ...]:
    """Every failed attempt counts under its reason; one that will be retried counts as a retry too."""
    failed = f"failed:{status.get('reason')}"
    return ("retried", failed) if status.get("phase") == "Retrying" else (failed,)


def _ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def start_attempt(req: WorkloadRequest, status: Mapping[str, Any], now: float, waits: bool = False) -> dict:
    """Queued -> Placing: the attempt is counted and its Job named before the Job is created, so a controller
    killed in between re-creates that same Job and never starts a second one. `waits`: its pods wait in the
    ledger's line if the GPUs are taken (no dry run came first)."""
    attempt = int(status.get("attempts") or 0) + 1
    name = job_name(req, attempt)
    said = (
        f"Job {name} created: its pods are placed now or wait in the ledger's line"
        if waits
        else f"the ledger can place it whole; Job {name} created"
    )
    return with_phase(
        status,
        "Placing",
        "Admitted",
        said,
        now,
        attempts=attempt,
        jobName=name,
        startTime=format_time(now),
        assignedNodes=[],
        devices=[],
    )


def queued(status: Mapping[str, Any], position: int, reason: str, message: str, now: float) -> dict:
    new = with_phase(status, "Queued", reason, message, now, queuePosition=position)
    return new
