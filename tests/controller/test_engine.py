"""The reconcile engine against a fake API and a fake ledger: the queue admits in order, one at a time, and
never starts a workload twice, even from a stale view. The clock and the draw are injected."""

from __future__ import annotations

import asyncio
import copy
import json

import pytest

from gpuledger.controller.controller import Engine, EngineSettings, NotLeader
from gpuledger.controller.kube import Conflict
from gpuledger.controller.mapping import parse_time
from gpuledger.controller.queue import Verdict
from gpuledger.core.model import Request
from gpuledger.core.pods.placement_codec import Binding
from gpuledger.core.pods.waiting_codec import WaitTicket, encode_waiting
from gpuledger.names import (
    ADMISSION_LABEL,
    PLACEMENT_ANNOTATION,
    SCHEDULING_GATE,
    WAITING_ANNOTATION,
    WHEN_FULL,
    WORKLOAD_UID_LABEL,
)
from tests.controller.support import agentaflow, warp

NOW = parse_time("2027-01-15T08:05:00Z")


class FakeApi:
    """What KubeWriter does, on dicts: status writes conditional on the resourceVersion."""

    def __init__(self):
        self.objects: dict[str, dict] = {}
        self.jobs: dict[tuple[str, str], dict] = {}
        self.created: list[str] = []
        self.deleted: list[str] = []
        self.rv = 100

    def add(self, obj: dict) -> dict:
        self.rv += 1
        obj = copy.deepcopy(obj)
        obj["metadata"]["resourceVersion"] = str(self.rv)
        self.objects[obj["metadata"]["name"]] = obj
        return obj

    def write_status(self, obj, status):
        stored = self.objects[obj["metadata"]["name"]]
        if stored["metadata"]["resourceVersion"] != obj["metadata"]["resourceVersion"]:
            raise Conflict("stale")
        self.rv += 1
        stored = {
            **stored,
            "status": copy.deepcopy(status),
            "metadata": {**stored["metadata"], "resourceVersion": str(self.rv)},
        }
        self.objects[obj["metadata"]["name"]] = stored
        return copy.deepcopy(stored)

    def get_workload(self, obj):
        return copy.deepcopy(self.objects.get(obj["metadata"]["name"]))

    def create_job(self, job):
        key = (job["metadata"]["namespace"], job["metadata"]["name"])
        if key in self.jobs:
            return False
        self.jobs[key] = job
        self.created.append(job["metadata"]["name"])
        return True

    def delete_job(self, namespace, name):
        self.jobs.pop((namespace, name), None)
        self.deleted.append(name)

    def read_job(self, namespace, name):
        return self.jobs.get((namespace, name))

    def read_node(self, name):
        return {"metadata": {"name": name}}

    def read_namespace(self, name):
        return {"metadata": {"name": name, "labels": {ADMISSION_LABEL: "enabled"}}}


class FakeLedger:
    """A node of `free` GPUs: a Job fits when its pods' GPUs do."""

    def __init__(self, free: int):
        self.free = free
        self.asked = 0

    def dry_run(self, jobs):
        self.asked += 1
        out = []
        for job in jobs:
            ann = job["spec"]["template"]["metadata"]["annotations"]
            need = int(ann["topology.scheduler/gpu-count"]) * job["spec"]["parallelism"]
            out.append(
                Verdict(True, "Fits")
                if need <= self.free
                else Verdict(False, "NotEnoughGpus", f"best: n1 has {self.free} free")
            )
        return out

    def held(self, ids):
        return [False for _ in ids]

    def snapshot(self):
        return {"nodes": {}}


def make(free=8, **settings):
    """The controller's own queue (when_full refuse) unless a test says otherwise."""
    settings.setdefault("when_full", "refuse")
    api, ledger = FakeApi(), FakeLedger(free)
    clock = [NOW]
    engine = Engine(
        api,
        ledger,
        settings=EngineSettings(gpunodes=False, requeue_interval_s=0, **settings),
        clock=lambda: clock[0],
        draw=lambda: 0.0,
    )
    return engine, api, ledger, clock


def submit(engine, api, obj):
    engine.observe_workload("ADDED", api.add(obj))


def place(engine, api, ledger, name, node="n1", devices=(0, 1, 2, 3)):
    """The webhook places the Job's pod, the ledger loses its GPUs, the watch reports the pod."""
    obj = api.objects[name]
    job = obj["status"]["jobName"]
    ledger.free -= len(devices)
    pod = {
        "metadata": {
            "name": f"{job}-x",
            "namespace": "ml",
            "labels": {
                WORKLOAD_UID_LABEL: obj["metadata"]["uid"],
                "job-name": job,
                "gpuledger.io/reservation-id": f"r-{name}",
            },
            "annotations": {PLACEMENT_ANNOTATION: json.dumps({"node": node, "devices": list(devices)})},
        },
        "status": {"phase": "Pending"},
    }
    engine.observe_job("ADDED", api.jobs[("ml", job)])
    engine.observe_pod("ADDED", pod)
    return pod


def phases(api):
    return {n: (o.get("status") or {}).get("phase") for n, o in api.objects.items()}


async def test_priority_order_one_placing_at_a_time_and_positions():
    engine, api, ledger, _ = make(free=8)
    submit(engine, api, agentaflow("low", gpus=4, priority=1))
    submit(engine, api, agentaflow("high", gpus=4, priority=10))
    submit(engine, api, warp("mid", gpus=4, priority=5))
    await engine.pass_once()  # Pending -> Queued, then the queue starts the first in order
    assert phases(api) == {"low": "Queued", "high": "Placing", "mid": "Queued"}
    assert len(api.created) == 1
    await engine.pass_once()  # `high` is placing: nothing else starts, positions are kept
    assert len(api.created) == 1
    assert (
        api.objects["mid"]["status"]["queuePosition"] == 1
        and api.objects["low"]["status"]["queuePosition"] == 2
    )
    place(engine, api, ledger, "high")
    await engine.pass_once()
    assert phases(api) == {"low": "Queued", "high": "Running", "mid": "Placing"}
    place(engine, api, ledger, "mid")
    await engine.pass_once()
    low = api.objects["low"]["status"]
    assert (low["phase"], low["reason"], low["queuePosition"]) == ("Queued", "NotEnoughGpus", 1)
    assert "best: n1 has 0 free" in low["message"]
    # `high` is deleted: its pod's deletion wakes the queue, and `low` starts
    engine.observe_workload("DELETED", api.objects.pop("high"))
    ledger.free += 4
    await engine.pass_once()
    assert api.objects["low"]["status"]["phase"] == "Placing"
    assert api.created == sorted(set(api.created), key=api.created.index)  # no Job twice


async def test_a_stale_view_conflicts_instead_of_starting_twice():
    engine, api, ledger, _ = make()
    submit(engine, api, agentaflow("a", gpus=2))
    await engine.pass_once()
    assert phases(api) == {"a": "Placing"} and len(api.created) == 1
    # another writer changed the object since: the engine's copy is stale
    stale = copy.deepcopy(engine.workloads[next(iter(engine.workloads))])
    stale["status"] = {"phase": "Queued"}
    stale["metadata"]["resourceVersion"] = "1"
    engine.workloads[next(iter(engine.workloads))] = stale
    engine.observe_workload("MODIFIED", stale)  # older resourceVersion than cached: ignored
    await engine.pass_once()
    assert len(api.created) == 1


async def test_restart_with_status_written_but_no_job_creates_that_same_job():
    engine, api, ledger, _ = make()
    submit(engine, api, agentaflow("a", gpus=2))
    await engine.pass_once()
    name = api.objects["a"]["status"]["jobName"]
    api.jobs.clear()  # as if the controller had died between the status write and the Job
    fresh, *_ = make()
    fresh.writer = api
    fresh.observe_workload(None, copy.deepcopy(api.objects["a"]))
    await fresh.pass_once()
    assert ("ml", name) in api.jobs and api.objects["a"]["status"]["attempts"] == 1


async def test_retry_arms_a_wake_after_an_earlier_timer_fired():
    engine, api, ledger, clock = make()
    engine._wake_in(0.0)
    await asyncio.sleep(0.01)  # the first timer fires (a loop turn, not a TTL)
    assert engine._wake.is_set()
    submit(engine, api, warp("r", gpus=2, retryPolicy={"backoffSeconds": 10}))
    await engine.pass_once()
    place(engine, api, ledger, "r", devices=(0, 1))
    await engine.pass_once()
    pod = next(iter(engine.pods.values()))
    engine.observe_pod("MODIFIED", {**pod, "status": {"phase": "Failed"}})
    clock[0] += 30
    await engine.pass_once()
    status = api.objects["r"]["status"]
    assert status["phase"] == "Retrying" and parse_time(status["nextRetryTime"]) == clock[0] + 5
    loop = asyncio.get_running_loop()
    assert engine._timer is not None and engine._timer.when() > loop.time() + 4
    clock[0] += 5
    await engine.pass_once()
    assert api.objects["r"]["status"]["phase"] in ("Queued", "Placing")


async def test_a_replica_whose_lease_went_stale_writes_nothing():
    engine, api, ledger, _ = make()
    fresh = [False]
    engine.may_act = lambda: fresh[0]
    submit(engine, api, agentaflow("a", gpus=2))
    with pytest.raises(NotLeader):  # ends the pass; run() waits for the Lease to be renewed
        await engine.pass_once()
    assert api.created == [] and "status" not in api.objects["a"]
    fresh[0] = True
    await engine.pass_once()
    assert phases(api) == {"a": "Placing"}


def gate(engine, api, name, arrival, priority=0, owner_uid=None, job=None):
    """The webhook admits a pod gated, with its ticket: it waits in the ledger's line. Without `owner_uid`
    a bare pod of another user; else the pod of that workload's Job."""
    req = Request(id=f"id-{name}", gpus=4, priority=priority, namespace="ml")
    labels = {WORKLOAD_UID_LABEL: owner_uid, "job-name": job} if owner_uid else {}
    pod = {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "labels": labels,
            "annotations": {
                WAITING_ANNOTATION: encode_waiting(WaitTicket(req, arrival, Binding("ml", name)), b"k")
            },
        },
        "spec": {"schedulingGates": [{"name": SCHEDULING_GATE}]},
        "status": {"phase": "Pending"},
    }
    engine.observe_pod("ADDED", pod)
    return pod


async def test_waiting_workloads_create_their_jobs_at_once_and_show_their_place_in_the_one_line():
    engine, api, ledger, _ = make(free=0, when_full="wait")
    submit(engine, api, agentaflow("low", gpus=4, priority=0))
    submit(engine, api, warp("high", gpus=4, priority="high"))
    await engine.pass_once()
    assert phases(api) == {"low": "Placing", "high": "Placing"}  # no dry run: the ledger's line decides
    assert ledger.asked == 0
    jobs = {n: o["status"]["jobName"] for n, o in api.objects.items()}
    assert all(
        api.jobs[("ml", j)]["spec"]["template"]["metadata"]["annotations"][WHEN_FULL] == "wait"
        for j in jobs.values()
    )
    # the webhook gates both workloads' pods; a bare pod of equal priority arrived before `low`'s
    gate(engine, api, f"{jobs['low']}-0", 10.0, 0, api.objects["low"]["metadata"]["uid"], jobs["low"])
    bare = gate(engine, api, "bare", 9.0, 0)
    gate(engine, api, f"{jobs['high']}-0", 12.0, 100, api.objects["high"]["metadata"]["uid"], jobs["high"])
    await engine.pass_once()
    low, high = api.objects["low"]["status"], api.objects["high"]["status"]
    assert (high["phase"], high["reason"], high["queuePosition"]) == ("Queued", "WaitingInLine", 1)
    assert (low["phase"], low["reason"], low["queuePosition"]) == ("Queued", "WaitingInLine", 3)
    assert "3rd in line" in low["message"]
    # the bare pod ahead of `low` leaves the line: `low` moves up, with no Job created twice
    engine.observe_pod("DELETED", bare)
    await engine.pass_once()
    assert api.objects["low"]["status"]["queuePosition"] == 2  # high is still ahead
    engine.observe_pod("DELETED", engine.pods[("ml", f"{jobs['high']}-0")])
    await engine.pass_once()
    assert api.objects["low"]["status"]["queuePosition"] == 1
    assert sorted(api.created) == sorted(jobs.values())


async def test_a_waiting_workload_runs_once_the_ledger_places_its_pod_and_survives_a_restart():
    engine, api, ledger, _ = make(free=0, when_full="wait")
    submit(engine, api, agentaflow("a", gpus=4))
    await engine.pass_once()
    job = api.objects["a"]["status"]["jobName"]
    pod = gate(engine, api, f"{job}-0", 10.0, 0, api.objects["a"]["metadata"]["uid"], job)
    await engine.pass_once()
    assert api.objects["a"]["status"]["queuePosition"] == 1
    # a new controller: same workloads, same pods; it creates nothing and shows the same place
    fresh, *_ = make(free=0, when_full="wait")
    fresh.writer = api
    fresh.observe_workload(None, copy.deepcopy(api.objects["a"]))
    fresh.observe_job("ADDED", api.jobs[("ml", job)])
    fresh.observe_pod("ADDED", copy.deepcopy(pod))
    await fresh.pass_once()
    assert api.objects["a"]["status"]["phase"] == "Queued" and api.created == [job]
    # the ledger places it: the placer writes the placement and removes the gate
    placed = copy.deepcopy(pod)
    placed["spec"]["schedulingGates"] = []
    placed["metadata"]["annotations"][PLACEMENT_ANNOTATION] = json.dumps({"node": "n1", "devices": [0, 1]})
    fresh.observe_pod("MODIFIED", placed)
    await fresh.pass_once()
    status = api.objects["a"]["status"]
    assert status["phase"] == "Running" and "queuePosition" not in status and status["attempts"] == 1


async def test_a_workload_annotated_refuse_keeps_the_controllers_queue():
    engine, api, ledger, _ = make(free=0, when_full="wait")
    obj = agentaflow("r", gpus=4)
    obj["metadata"]["annotations"] = {WHEN_FULL: "refuse"}
    submit(engine, api, obj)
    await engine.pass_once()
    status = api.objects["r"]["status"]
    assert (status["phase"], status["reason"]) == ("Queued", "NotEnoughGpus") and api.created == []
    bad = agentaflow("bad", gpus=4)
    bad["metadata"]["annotations"] = {WHEN_FULL: "sometimes"}
    submit(engine, api, bad)
    await engine.pass_once()
    status = api.objects["bad"]["status"]
    assert (status["phase"], status["reason"]) == ("Failed", "InvalidSpec")
    assert WHEN_FULL in status["message"] and "'sometimes'" in status["message"]
