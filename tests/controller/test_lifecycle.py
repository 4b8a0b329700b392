"""One workload's transitions, with the time and the backoff's draw injected: no clock, no sleep."""

from __future__ import annotations

import json

from gpuledger.controller import lifecycle
from gpuledger.controller.lifecycle import Observed, start_attempt, step
from gpuledger.controller.mapping import format_time, from_object, parse_time
from gpuledger.names import PLACEMENT_ANNOTATION
from tests.controller.support import warp

NOW = parse_time("2027-01-15T08:10:00Z")


def req(**spec):
    return from_object(warp(gpus=2, **spec))


def job(conditions=(), succeeded=0):
    return {
        "metadata": {"name": "j"},
        "status": {"conditions": [dict(c) for c in conditions], "succeeded": succeeded},
    }


def pod(name, node="n1", devices=(0, 1), phase="Pending"):
    placement = json.dumps({"v": 1, "id": f"r-{name}", "node": node, "devices": list(devices), "sig": "x"})
    return {
        "metadata": {"name": name, "annotations": {PLACEMENT_ANNOTATION: placement}},
        "status": {"phase": phase},
    }


def placing(r, now=NOW):
    return start_attempt(r, {"phase": "Queued"}, now)


def test_new_workload_is_queued():
    s = step(req(), {}, Observed(), NOW, 0.5)
    assert s.status["phase"] == "Queued" and s.status["queuedTime"] == format_time(NOW)


def test_start_counts_the_attempt_and_names_the_job_before_creating_it():
    r = req()
    status = placing(r)
    assert (status["phase"], status["attempts"]) == ("Placing", 1) and status["jobName"].endswith("-1")
    # the controller died before creating the Job: the next one creates that same Job, no second attempt
    s = step(r, status, Observed(job=None), NOW + 5, 0.5)
    assert s.create_job and s.status == status


def test_placed_pods_make_it_running_with_nodes_and_devices():
    r = req(parallelism=2)
    status = placing(r)
    s = step(r, status, Observed(job=job(), pods=[pod("p0", "n1"), pod("p1", "n2", (3, 4))]), NOW + 1, 0.5)
    assert s.status["phase"] == "Running" and s.status["assignedNodes"] == ["n1", "n2"]
    assert s.status["devices"][1] == {"pod": "p1", "node": "n2", "indices": [3, 4]}
    assert s.events == ("scheduled:default",)
    half = step(r, status, Observed(job=job(), pods=[pod("p0")]), NOW + 1, 0.5)
    assert half.status["phase"] == "Placing"


def test_failed_pod_retries_on_the_documented_schedule():
    r = req(retryPolicy={"maxRetries": 2, "backoffSeconds": 10})
    status = placing(r)
    running = step(r, status, Observed(job=job(), pods=[pod("p0")]), NOW, 0.5).status
    s = step(r, running, Observed(job=job(), pods=[pod("p0", phase="Failed")]), NOW + 60, 0.0)
    assert (
        s.status["phase"] == "Retrying"
        and s.status["reason"] == "PodFailed"
        and s.delete_job == status["jobName"]
    )
    # retry 1: nominal 10 s, draw 0 -> half of it
    assert parse_time(s.status["nextRetryTime"]) == NOW + 60 + 5
    assert s.events == ("retried", "failed:PodFailed")
    # not before its time; at its time back to the queue, attempts kept
    assert step(r, s.status, Observed(), NOW + 64, 0.5).status["phase"] == "Retrying"
    back = step(r, s.status, Observed(), NOW + 65, 0.5).status
    assert back["phase"] == "Queued" and back["attempts"] == 1
    # second attempt fails: retry 2 waits 20 s nominal (draw 0.5 -> 15 s)
    second = start_attempt(r, back, NOW + 70)
    assert second["attempts"] == 2 and second["jobName"].endswith("-2")
    s2 = step(
        r,
        second,
        Observed(job=job([{"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded"}])),
        NOW + 80,
        0.5,
    )
    assert parse_time(s2.status["nextRetryTime"]) == NOW + 80 + 15
    third = start_attempt(r, {**s2.status, "phase": "Queued"}, NOW + 100)
    s3 = step(r, third, Observed(job=job([{"type": "Failed", "status": "True"}])), NOW + 110, 0.5)
    assert s3.status["phase"] == "Failed" and "no retries left" in s3.status["message"]
    assert s3.events == ("failed:PodFailed",)


def test_lost_node_is_retried():
    r = req()
    running = step(r, placing(r), Observed(job=job(), pods=[pod("p0", "n9")]), NOW, 0.5).status
    s = step(
        r, running, Observed(job=job(), pods=[pod("p0", "n9")], lost_nodes=frozenset({"n9"})), NOW + 5, 0.5
    )
    assert (
        s.status["phase"] == "Retrying" and s.status["reason"] == "NodeLost" and "n9" in s.status["message"]
    )


def test_pods_not_placed_in_time_is_a_transient_denial():
    r = req()
    status = placing(r)
    assert step(r, status, Observed(job=job()), NOW + 59, 0.5, placing_timeout_s=60).status == status
    s = step(r, status, Observed(job=job()), NOW + 60, 0.5, placing_timeout_s=60)
    assert s.status["reason"] == "PlacementDenied" and s.status["phase"] == "Retrying" and s.delete_job


def test_pods_waiting_in_the_ledgers_line_are_queued_with_their_place_and_never_time_out():
    r = req(parallelism=2)
    status = start_attempt(r, {"phase": "Queued"}, NOW, waits=True)
    gated = [{"metadata": {"name": n}, "status": {"phase": "Pending"}} for n in ("p0", "p1")]
    s = step(r, status, Observed(job=job(), pods=gated, in_line={"p0": 7, "p1": 4}), NOW + 1, 0.5)
    assert (s.status["phase"], s.status["reason"], s.status["queuePosition"]) == (
        "Queued",
        "WaitingInLine",
        4,
    )
    assert s.status["jobName"] == status["jobName"] and not s.create_job
    # long past the placing timeout, still in line: it waits, as its pods do
    later = step(r, s.status, Observed(job=job(), pods=gated, in_line={"p0": 1, "p1": 2}), NOW + 600, 0.5)
    assert later.status["phase"] == "Queued" and later.status["queuePosition"] == 1 and not later.delete_job
    # one pod is being replaced (not in line yet): no timeout, no change
    half = step(r, later.status, Observed(job=job(), pods=gated[:1], in_line={"p0": 1}), NOW + 700, 0.5)
    assert half.status == later.status
    # the ledger places both: Running
    done = step(r, later.status, Observed(job=job(), pods=[pod("p0"), pod("p1", "n2")]), NOW + 800, 0.5)
    assert done.status["phase"] == "Running" and "queuePosition" not in done.status


def test_complete_job_succeeds():
    r = req()
    running = step(r, placing(r), Observed(job=job(), pods=[pod("p0")]), NOW, 0.5).status
    s = step(
        r, running, Observed(job=job([{"type": "Complete", "status": "True"}], succeeded=1)), NOW + 9, 0.5
    )
    assert s.status["phase"] == "Succeeded" and s.status["completionTime"] == format_time(NOW + 9)
    assert step(r, s.status, Observed(), NOW + 99, 0.5).status == s.status  # terminal


def test_deadline_counts_queue_time():
    r = req(activeDeadlineSeconds=60)  # created 08:00:00, NOW is 08:10
    s = step(r, {"phase": "Queued"}, Observed(), NOW, 0.5)
    assert s.status["phase"] == "Failed" and s.status["reason"] == "DeadlineExceeded"


def test_suspend_releases_and_resume_requeues():
    r = req(suspend=True)
    running = {**placing(req()), "phase": "Running"}
    s = step(r, running, Observed(job=job(), pods=[pod("p0")]), NOW, 0.5)
    assert s.status["phase"] == "Pending" and s.status["reason"] == "Suspended" and s.delete_job
    resumed = step(req(), s.status, Observed(), NOW + 1, 0.5)
    assert resumed.status["phase"] == "Queued"


def test_namespace_not_opted_in_waits_named():
    s = step(req(), {}, Observed(namespace_enabled=False), NOW, 0.5)
    assert (
        s.status["reason"] == "NamespaceNotEnabled"
        and "gpuledger.io/admission=enabled" in s.status["message"]
    )


def test_condition_time_moves_only_on_change():
    a = lifecycle.with_phase({}, "Queued", "Queued", "m", NOW)
    b = lifecycle.with_phase(a, "Queued", "NotEnoughGpus", "m2", NOW + 30)
    queued = next(c for c in b["conditions"] if c["type"] == "Queued")
    assert queued["lastTransitionTime"] == format_time(NOW)
