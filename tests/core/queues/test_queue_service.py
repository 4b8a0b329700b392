"""GPU queues through the in-process service and its sync target: the preemption orders the sync carries out
(`preemptions_due`), a refused eviction (`eviction_refused`), and each GPUQueue's status from the ledger's
books (`queue_status`), whose figures are those `gpuledger queues` computes from the API objects."""

from __future__ import annotations

import pytest

from gpuledger.core.ledger import LedgerConfig
from gpuledger.core.model import Denial, Request
from gpuledger.core.queues.waiting import Waiting
from gpuledger.service.ledger_service import AdmitCall, LedgerService
from gpuledger.service.preemption_orders import EvictionRefused, PreemptionOrder
from gpuledger.service.sync_writer import SyncFenced
from gpuledger.sync.targets import LocalLedgerTarget
from gpuledger.views.queues import queues_view
from tests.core.passes.test_held_plans import KEY, NOW, T0, World
from tests.core.queues.test_queue_book import gpu_queue

HOLDER = "sync-1"


def served(world: World) -> tuple[LedgerService, LocalLedgerTarget]:
    config = LedgerConfig(placement_key=KEY, default_strategy="best_fit")
    service = LedgerService(config, {"kind": "kubernetes"})
    target = LocalLedgerTarget(service, clock=lambda: NOW)
    assert target.sync_lease(HOLDER, 30.0)["held"]
    target.resync(list(world.objects.values()), HOLDER)
    return service, target


def borrowed_world() -> tuple[World, dict]:
    w = World()
    w.run("a1", "ns-a", started=T0)
    w.run("a2", "ns-a", started=T0 + 60)
    gated = w.wait("b1", "ns-b")
    return w, gated


def test_preemptions_due_hand_out_the_plan_and_a_refusal_drops_it():
    w, _ = borrowed_world()
    service, target = served(w)
    assert target.place_waiting(HOLDER) == []
    (order,) = target.preemptions_due(HOLDER)
    assert isinstance(order, PreemptionOrder)
    assert (order.id, order.namespace, order.name, order.recorded) == ("ns-b-b1", "ns-b", "b1", False)
    assert [(v.namespace, v.name, v.uid, v.rule) for v in order.victims] == [
        ("ns-a", "a2", "uid-ns-a-a2", "reclaim")
    ]
    assert order.record and "evicting 1 pod(s) (8 GPUs)" in order.message
    assert target.preemptions_due(HOLDER) == [order]  # handed out again until carried out: harmless
    target.eviction_refused([EvictionRefused(order.id, "ns-a", "a2", "uid-ns-a-a2", 429, "budget")], HOLDER)
    assert target.preemptions_due(HOLDER) == []
    with pytest.raises(SyncFenced):
        target.preemptions_due("another-sync")


def test_queue_status_is_what_gpuledger_queues_computes_from_the_api_objects():
    w, _ = borrowed_world()
    _, target = served(w)
    status = target.queue_status(HOLDER)
    objects = list(w.objects.values())
    kinds = {k: [o for o in objects if o["kind"] == k] for k in ("GPUQueue", "Namespace", "Node", "Pod")}
    view = queues_view(kinds["GPUQueue"], kinds["Namespace"], kinds["Node"], kinds["Pod"])
    rows = {row.name: row.as_dict() for row in view.rows}
    assert set(status) == {"team-a", "team-b"}  # the GPUQueue objects (not the implicit default)
    for name, body in status.items():
        row = rows[name]
        assert (body["quota"], body["used"], body["borrowed"], body["share"]) == (
            row["quota"],
            row["used"],
            row["borrowed"],
            row["share"],
        )
        assert [(p["product"], p["quota"], p["used"], p["borrowed"]) for p in body["products"]] == [
            (q["product"], q["gpus"], q["used"], q["borrowed"]) for q in row["quotas"]
        ]
        assert body["waiting"] == len(row["waiting"])
    assert status["team-a"]["used"] == 16 and status["team-a"]["borrowed"] == 8
    assert status["team-b"]["waiting"] == 1


def test_no_gpu_queue_no_status():
    w = World(queues=({"kind": "Namespace", "metadata": {"name": "other"}},))
    _, target = served(w)
    assert target.queue_status(HOLDER) == {}
    assert target.preemptions_due(HOLDER) == []


def test_a_dry_run_says_a_pod_over_its_quota_would_wait_or_be_denied():
    w = World(queues=(gpu_queue("team-a", 8, quotas=[{"product": "any", "gpus": 8, "borrowingLimit": 0}]),))
    w.run("a1", "ns-a")
    service, _ = served(w)
    req = Request(id="ns-a-a2", gpus=8, namespace="ns-a", name="a2")
    (waits,) = service.admit([AdmitCall(req, dry_run=True, may_wait=True)], NOW)
    assert isinstance(waits, Waiting) and "queue team-a is at its limit: 8 of 8 GPUs used" in waits.message
    (denied,) = service.admit([AdmitCall(req, dry_run=True, may_wait=False)], NOW)
    assert isinstance(denied, Denial) and "queue team-a is at its limit" in denied.message
    explained = service.explain(req, now=NOW)
    assert "queue team-a is at its limit" in explained.preemption
