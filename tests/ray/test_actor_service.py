"""LedgerService (what the Ray actor holds), in-process: resync keeps admissions in flight,
sweeps, sources."""

from __future__ import annotations

import json
import logging
from dataclasses import replace

import jsonpatch
import pytest
import yaml

from gpuledger.core.model import GroupSpec, Placement, Request
from gpuledger.service.ledger_service import AdmitCall, LedgerService, Recoveries, Unavailable
from gpuledger.service.settings import LedgerSettings
from tests.webhook.webhook_support import cluster, config

NOW = 1000.0


def svc(objects, source_kind="objects"):
    spec = {"kind": "objects", "objects": objects} if source_kind == "objects" else source_kind
    return LedgerService(config().ledger_config(), spec, now=NOW)


def test_resync_keeps_reservations_not_yet_on_a_pod():
    nodes = cluster(2, 8)
    s = svc(nodes)
    [p] = s.admit([AdmitCall(Request(id="a", gpus=3))], NOW)
    assert isinstance(p, Placement)
    report = s.resync(nodes, NOW + 1)  # a watch error: the pod is not stored yet
    assert report["kept"] == 1
    [held] = s.lookup(["a"])
    assert (held.placement.node, held.placement.devices, held.confirmed) == (p.node, p.devices, False)
    # the devices stay taken
    [q] = s.admit([AdmitCall(Request(id="b", gpus=8))], NOW + 1)
    assert isinstance(q, Placement) and q.node != p.node


def test_resync_confirms_what_the_list_stores():
    import asyncio

    from gpuledger.webhook.admission.handler import AdmissionHandler
    from gpuledger.webhook.ledger.client import InProcessLedgerClient
    from tests.webhook.webhook_support import Clock, gpu_pod, review

    nodes = cluster(2, 8)
    s = svc(nodes)
    h = AdmissionHandler(config(), InProcessLedgerClient(s, Clock(NOW)))
    pod = gpu_pod(2)
    d = asyncio.run(h.mutate(review(pod)))
    stored = jsonpatch.apply_patch(pod, d.patch)
    stored["spec"]["nodeName"] = d.node
    s.resync([*nodes, stored], NOW + 1)
    [held] = s.lookup([d.reservation_id])
    assert held.confirmed and held.placement.devices == d.devices
    assert s.status()["pending"] == 0


def test_group_members_in_flight_are_not_replayed():
    nodes = cluster(4, 8)
    s = svc(nodes)
    group = GroupSpec("job/ns/j", 2)
    [p] = s.admit([AdmitCall(Request(id="g0", gpus=4, group=group))], NOW)
    assert isinstance(p, Placement) and p.group == "job/ns/j"
    report = s.resync(nodes, NOW + 1)
    assert report["kept"] == 0 and s.lookup(["g0"]) == [None]


def test_sweep_confirms_stored_and_expires_the_rest(tmp_path):
    nodes = cluster(1, 8)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump_all(nodes))
    s = svc(None, {"kind": "file", "path": str(path)})
    a, b = s.admit([AdmitCall(Request(id="a", gpus=1)), AdmitCall(Request(id="b", gpus=1))], NOW)
    stored = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "pa", "namespace": "x", "labels": {"gpuledger.io/reservation-id": "a"}},
        "spec": {"nodeName": a.node, "containers": [{"name": "c"}]},
    }
    path.write_text(yaml.safe_dump_all([*nodes, stored]))
    assert s.sweep(NOW + 10) == []  # not old enough
    assert s.sweep(NOW + 31) == ["b"]
    assert s.lookup(["a"])[0].confirmed and s.lookup(["b"]) == [None]


def test_dry_run_and_prior_ids():
    s = svc(cluster(1, 8))
    [dry] = s.admit([AdmitCall(Request(id="d", gpus=8), dry_run=True)], NOW)
    assert isinstance(dry, Placement) and s.lookup(["d"]) == [None]
    [first] = s.admit([AdmitCall(Request(id="r1", gpus=2))], NOW)
    [again] = s.admit([AdmitCall(Request(id="r2", gpus=2), prior_id="r1")], NOW)
    assert again == first and s.lookup(["r2"]) == [None]
    s.confirm(["r1"], NOW)
    [fresh] = s.admit([AdmitCall(Request(id="r3", gpus=2), prior_id="r1")], NOW)
    assert fresh.id == "r3" and not set(fresh.devices) & set(first.devices)


def test_kubernetes_source_waits_for_resync():
    s = LedgerService(config().ledger_config(), {"kind": "kubernetes"}, now=NOW)
    assert s.status()["synced"] is False and s.status()["external_source"] is True
    [u] = s.admit([AdmitCall(Request(id="x", gpus=1))], NOW)
    assert isinstance(u, Unavailable) and "not synced" in u.message
    assert isinstance(s.lookup(["x"])[0], Unavailable)
    assert s.sweep(NOW + 100) == []
    s.resync(cluster(1, 8), NOW)
    assert isinstance(s.admit([AdmitCall(Request(id="x", gpus=1))], NOW)[0], Placement)
    assert json.loads(json.dumps(s.status()))["nodes"] == 1


def test_claims_mark_one_pod_per_reservation_and_clear_on_confirm():
    s = svc(cluster(1, 8))
    [p] = s.admit([AdmitCall(Request(id="a", gpus=1))], NOW)
    [first] = s.claim(["a"])
    assert first.claimed is False and s.lookup(["a"])[0].claimed is True
    [reuse] = s.admit([AdmitCall(Request(id="b", gpus=1), prior_id="a")], NOW)
    assert reuse.id == "b"  # a claimed reservation is not handed out again as a reinvocation
    s.confirm(["a"], NOW)
    assert s.lookup(["a"])[0] == s.lookup(["a"])[0] and s.lookup(["a"])[0].confirmed
    assert "a" not in s._claimed
    assert s.claim(["nope"]) == [None]


def test_a_claim_retried_by_the_same_admission_answers_as_the_first_did():
    """A claim whose answer was lost (the channel dropped after the actor ran it) is re-sent through Ray by
    the same admission request: it must not be told its own reservation "belongs to another pod"."""
    s = svc(cluster(1, 8))
    s.admit([AdmitCall(Request(id="a", gpus=1))], NOW)
    [first] = s.claim([("a", "uid-1")])
    [retry] = s.claim([("a", "uid-1")])
    [copy] = s.claim([("a", "uid-2")])
    [anonymous] = s.claim(["a"])
    assert first.claimed is False and retry.claimed is False
    assert copy.claimed is True and anonymous.claimed is True  # another request: a copy, as before
    assert s._claimed == {"a": "uid-1"}


def test_pending_clears_when_the_watch_confirms_or_deletes_the_pod():
    """A reservation confirmed by its stored pod (a watch event, not a resync) is no longer replayed."""
    import asyncio

    from gpuledger.webhook.admission.handler import AdmissionHandler
    from gpuledger.webhook.ledger.client import InProcessLedgerClient
    from tests.webhook.webhook_support import Clock, gpu_pod, review

    s = svc(cluster(2, 8))
    h = AdmissionHandler(config(), InProcessLedgerClient(s, Clock(NOW)))
    pod = gpu_pod(2)
    d = asyncio.run(h.mutate(review(pod)))
    assert s.status()["pending"] == 1
    stored = jsonpatch.apply_patch(pod, d.patch)
    stored["spec"]["nodeName"] = d.node
    s.apply_events([("ADDED", stored)], NOW + 1)
    assert s.status()["pending"] == 0
    [held] = s.lookup([d.reservation_id])
    assert held.confirmed
    s.apply_events([("DELETED", stored)], NOW + 2)
    assert s.lookup([d.reservation_id]) == [None] and s.status()["pending"] == 0


# ------------------------------------------------------------------------------------------- live settings
def test_set_default_strategy_is_live_recorded_and_rejects_unknown_names(caplog):
    s = svc(cluster(2, 8))
    [a] = s.admit([AdmitCall(Request(id="a", gpus=2))], NOW)
    assert a.strategy == "fgd_host" and s.get_settings()["changed_by"] == "config (ledger start)"
    with caplog.at_level(logging.INFO, logger="gpuledger.service"):
        settings = s.set_default_strategy("Priority", "alice", NOW + 5)  # any accepted spelling
    assert (settings["default_strategy"], settings["changed_by"], settings["changed_at"]) == (
        "priority",
        "alice",
        NOW + 5,
    )
    assert settings["history"][-1] == {
        "at": NOW + 5,
        "by": "alice",
        "changes": {"default_strategy": ["fgd_host", "priority"]},
    }
    assert "ledger settings changed by alice: default_strategy 'fgd_host' -> 'priority'" in caplog.text
    [b] = s.admit([AdmitCall(Request(id="b", gpus=2))], NOW + 6)
    assert b.strategy == "priority"  # the next decision, no rebuild
    status = s.status()
    assert (status["default_strategy"], status["settings_changed_by"], status["settings_changed_at"]) == (
        "priority",
        "alice",
        NOW + 5,
    )
    with pytest.raises(
        ValueError,
        match=r"strategy='fastest' is not accepted: expected one of balanced, best_fit, "
        r".*least_utilized, priority, random, round_robin",
    ):
        s.set_default_strategy("fastest", "alice", NOW + 7)
    with pytest.raises(ValueError, match=r"who='' is not accepted"):
        s.set_default_strategy("random", "", NOW + 7)
    assert s.settings.default_strategy == "priority" and len(s.get_settings()["history"]) == 2


def test_scoring_weights_change_the_balanced_choice_live():
    s = svc(cluster(2, 8))
    base = LedgerSettings(default_strategy="balanced", scoring_weights={"resourceAvailability": 1})
    assert s.apply_config(base, "replica-a", NOW)["applied"] is True
    [fill] = s.admit([AdmitCall(Request(id="fill", gpus=6))], NOW)
    [spread] = s.admit([AdmitCall(Request(id="x", gpus=2), dry_run=True)], NOW)
    assert spread.node != fill.node  # availability first: the empty node
    answer = s.apply_config(replace(base, scoring_weights={"topologyAlignment": 1}), "replica-a", NOW + 1)
    assert answer["changes"]["scoring_weights"][1]["topologyAlignment"] == 1.0
    [packed] = s.admit([AdmitCall(Request(id="x", gpus=2), dry_run=True)], NOW + 1)
    assert packed.node == fill.node
    # the same config pushed again (another replica, a re-push) changes nothing
    assert (
        s.apply_config(replace(base, scoring_weights={"topologyAlignment": 1}), "replica-b", NOW + 2)[
            "applied"
        ]
        is False
    )
    assert s.changed_by == "replica-a"


def test_new_label_keys_rebuild_the_ledger():
    nodes = cluster(4, 8)
    for n in nodes:  # a second labelling: racks across the leaves
        n["metadata"]["labels"]["example.com/rack"] = f"rack-{int(n['metadata']['name'][-1]) // 2}"
    s = svc(nodes)
    assert {n.info.leaf for n in s.ledger.index.nodes.values()} == {"leaf-0", "leaf-1"}
    s.apply_config(LedgerSettings(leaf_label="example.com/rack"), "replica-a", NOW)
    assert {n.info.leaf for n in s.ledger.index.nodes.values()} == {"rack-0", "rack-1"}
    assert s.synced and s.rebuilds == 2
    # fed by the API: the ledger waits for the cluster sync's resync (it sees synced: false)
    api = LedgerService(config().ledger_config(), {"kind": "kubernetes"}, now=NOW)
    api.resync(nodes, NOW)
    api.apply_config(LedgerSettings(leaf_label="example.com/rack"), "replica-a", NOW)
    assert api.status()["synced"] is False
    api.resync(nodes, NOW + 1)
    assert {n.info.leaf for n in api.ledger.index.nodes.values()} == {"rack-0", "rack-1"}


def test_rebuild_times_are_kept_for_the_recovery_histogram():
    ticks = iter([10.0, 10.25, 20.0, 20.5])
    s = LedgerService(
        config().ledger_config(),
        {"kind": "kubernetes"},
        now=NOW,
        timer=lambda: next(ticks),
        incarnation="inc-1",
    )
    assert s.stats().recoveries == Recoveries("inc-1", 0, ())
    assert s.resync(cluster(1, 8), NOW)["seconds"] == 0.25
    s.resync(cluster(1, 8), NOW + 1)
    stats = s.stats()
    assert stats.recoveries == Recoveries("inc-1", 2, (0.25, 0.5))
    assert stats.settings["default_strategy"] == "fgd_host" and "history" not in stats.settings
    assert stats.gpus_total == 8  # still the ledger's totals
    d = json.loads(json.dumps(stats.as_dict()))
    assert d["recoveries"] == {"incarnation": "inc-1", "count": 2, "recent": [0.25, 0.5]}
    assert d["settings"]["scoring_weights"]["resourceAvailability"] == 0.4


def test_the_actor_settles_the_heap_after_a_rebuild_not_the_first_admission(tmp_path):
    """After a resync the replaced ledger is collected and the new one frozen out of the collector's sight, in
    the rebuild's own call (the core pauses the collector while it loads: the first admission after it would
    otherwise pay for a full collection)."""
    import asyncio
    import gc
    import weakref

    from gpuledger.ray.actor import LedgerActor

    source = tmp_path / "cluster.yaml"
    source.write_text(yaml.safe_dump({"apiVersion": "v1", "kind": "List", "items": cluster(2, 8)}))
    actor = LedgerActor(config().ledger_config(), {"kind": "file", "path": str(source)}, sweep_interval_s=0)
    try:
        replaced = weakref.ref(actor.service.ledger)
        gc.unfreeze()
        asyncio.run(actor.resync(cluster(2, 8)))
        assert replaced() is None  # the old ledger's cycles are gone, not frozen in
        assert gc.get_freeze_count() > 0 and actor.service.rebuilds == 2
        frozen = gc.get_freeze_count()
        asyncio.run(actor.get_settings())  # no rebuild: nothing collected or frozen again
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_an_actor_call_does_not_build_the_status_report(monkeypatch):
    """Every call checks whether the actor must expire reservations itself; with the shipped source (the
    cluster sync's) that check once built the whole status report, whose conflict list walks every
    reservation: ~15 ms a call at 10,000 nodes and 76,000 pods. Only `status` may build it."""
    import asyncio

    from gpuledger.ray.actor import LedgerActor

    actor = LedgerActor(config().ledger_config(), {"kind": "kubernetes"}, sweep_interval_s=1.0)
    reports = []
    real_status = actor.service.status
    monkeypatch.setattr(actor.service, "status", lambda: reports.append(1) or real_status())

    async def calls() -> None:
        await actor.resync(cluster(2, 8))
        [placed] = await actor.admit([AdmitCall(Request(id="r1", gpus=1))])
        assert isinstance(placed, Placement)
        [held] = await actor.claim([("r1", "uid-1")])
        assert held is not None and held.placement == placed
        assert await actor.lookup(["r1"]) == [replace(held, claimed=True)]
        await actor.apply_events([])
        assert actor._sweeper is None  # the sync expires reservations here, not the actor's sweeper

    asyncio.run(calls())
    assert reports == []
    assert (asyncio.run(actor.status()))["external_source"] is True and reports == [1]


def _stored_pod(s: LedgerService, gpus: int) -> dict:
    """A pod admitted through the webhook's handler by `s`, as the API server stores it once bound."""
    import asyncio

    from gpuledger.webhook.admission.handler import AdmissionHandler
    from gpuledger.webhook.ledger.client import InProcessLedgerClient
    from tests.webhook.webhook_support import Clock, gpu_pod, review

    h = AdmissionHandler(config(), InProcessLedgerClient(s, Clock(NOW)))
    pod = gpu_pod(gpus)
    d = asyncio.run(h.mutate(review(pod)))
    stored = jsonpatch.apply_patch(pod, d.patch)
    stored["spec"]["nodeName"] = d.node
    return stored


def test_a_stepped_resync_answers_admissions_from_the_ledger_it_replaces():
    """Between the steps of a resync's build, admissions, claims and lookups are answered by the ledger being
    replaced; what they reserve is replayed onto the new ledger at the swap (kept, the same devices), and the
    pods the list stores are confirmed there."""
    nodes = cluster(4, 8)
    s = svc(nodes)
    stored = _stored_pod(s, 2)
    stored_rid = stored["metadata"]["labels"]["gpuledger.io/reservation-id"]
    replaced = s.ledger
    objects = [*nodes, stored]
    steps = s.resync_in_steps(objects, NOW + 1, step=1)
    next(steps)
    [during] = s.admit([AdmitCall(Request(id="during", gpus=3))], NOW + 1)
    assert isinstance(during, Placement) and s.ledger is replaced
    [claimed] = s.claim([("during", "uid-during")])
    assert claimed is not None and claimed.placement == during
    swapped_at_pause = []
    while True:
        try:
            next(steps)
        except StopIteration as done:
            report = done.value
            break
        swapped_at_pause.append(s.ledger is not replaced)
    # the swap is done at once, after the build's pauses (the replaced ledger is freed in steps after it)
    swapped = swapped_at_pause.index(True)
    assert swapped >= 2 * len(objects) - 1 and all(swapped_at_pause[swapped:])
    assert s.ledger is not replaced
    assert (report["kept"], report["lost"], report["objects"]) == (1, 0, len(objects))
    [held, confirmed] = s.lookup(["during", stored_rid])
    assert (held.placement.node, held.placement.devices) == (during.node, during.devices)
    assert held.claimed and not held.confirmed and confirmed.confirmed
    assert s.status()["pending"] == 1 and s.rebuilds == 2


def test_an_admission_during_a_stepped_resync_loses_devices_the_list_shows_taken():
    """The ledger being replaced may be stale (that is why it is resynced): a reservation it granted on
    devices that the list shows a stored pod holding is lost at the swap, not double-booked."""
    from gpuledger.core.steps import drain

    nodes = cluster(1, 8)
    s = svc(nodes)
    stored = _stored_pod(s, 8)
    s.release([stored["metadata"]["labels"]["gpuledger.io/reservation-id"]])  # the stale ledger forgot it
    steps = s.resync_in_steps([*nodes, stored], NOW + 1, step=1)
    next(steps)
    [stale] = s.admit([AdmitCall(Request(id="stale", gpus=8))], NOW + 1)
    assert isinstance(stale, Placement)
    report = drain(steps)
    assert (report["kept"], report["lost"]) == (0, 1)
    assert s.lookup(["stale"]) == [None] and s.status()["pending"] == 0
    [denied] = s.admit([AdmitCall(Request(id="after", gpus=1))], NOW + 2)
    assert not isinstance(denied, Placement)


def test_the_actor_serves_admissions_during_a_resync_and_queues_the_clusters_writes():
    """The actor's resync awaits between build steps: an admission is answered meanwhile (and kept), while an
    event batch and a config change wait behind the resync's lock and land on the new ledger; a refused
    resync releases the lock."""
    import asyncio

    from gpuledger.ray.actor import LedgerActor
    from gpuledger.service.sync_writer import SyncFenced

    async def scenario() -> None:
        source = {"kind": "kubernetes"}
        actor = LedgerActor(config().ledger_config(), source, sweep_interval_s=0, resync_step=1)
        await actor.resync(cluster(4, 8))
        replaced = actor.service.ledger
        resync = asyncio.create_task(actor.resync(cluster(6, 8)))
        await asyncio.sleep(0)  # the resync builds its first step and pauses
        assert not resync.done()
        [placed] = await actor.admit([AdmitCall(Request(id="r1", gpus=2))])
        assert isinstance(placed, Placement) and actor.service.ledger is replaced
        assert await actor.ping() == actor.incarnation
        assert (await actor.sync_lease("sync-b", 30.0))["held"]  # renewals are answered meanwhile too
        await actor.sync_lease("sync-b", 30.0, hand_back=True)
        extra = cluster(7, 8)[6]
        events = asyncio.create_task(actor.apply_events([("ADDED", extra)]))
        strategy = asyncio.create_task(actor.set_default_strategy("best_fit", "tester"))
        await asyncio.sleep(0)
        assert not events.done() and not strategy.done() and not resync.done()
        report = await resync
        assert report["kept"] == 1 and actor.service.ledger is not replaced
        assert await events == 1 and (await strategy)["default_strategy"] == "best_fit"
        assert (await actor.status())["nodes"] == 7
        [held] = await actor.lookup(["r1"])
        assert held.placement.devices == placed.devices
        await actor.sync_lease("sync-c", 30.0)
        with pytest.raises(SyncFenced):
            await actor.resync(cluster(1, 8), holder="sync-d")
        await asyncio.wait_for(actor.resync(cluster(1, 8), holder="sync-c"), 5)  # the lock was let go
        assert await actor.apply_events([], holder="sync-c") == 0

    asyncio.run(scenario())


def test_admissions_during_the_first_stepped_resync_are_unavailable_not_placed_on_the_empty_ledger():
    """A ledger fed from the API starts empty and unsynced: while its first list is being built, admissions
    between the steps answer Unavailable (fail closed), as before the list arrived."""
    from gpuledger.core.steps import drain

    s = LedgerService(config().ledger_config(), {"kind": "kubernetes"}, now=NOW)
    steps = s.resync_in_steps(cluster(2, 8), NOW, step=1)
    next(steps)
    [early] = s.admit([AdmitCall(Request(id="early", gpus=1))], NOW)
    assert isinstance(early, Unavailable) and s.lookup(["early"]) == [s._unsynced()]
    report = drain(steps)
    assert (report["kept"], report["lost"]) == (0, 0) and s.synced
    [placed] = s.admit([AdmitCall(Request(id="after", gpus=1))], NOW)
    assert isinstance(placed, Placement)


def test_a_resync_with_nothing_pending_reads_the_pods_once(monkeypatch):
    """Which pending reservations the list stores is only asked when some are pending: after a restart (none
    are) a resync reads the pods for its build alone, not once more for their reservation ids; with one
    pending, the pass is made (stepped as the build is) and the stored pod's reservation is confirmed."""
    import gpuledger.service.ledger_service as service_module
    from gpuledger.core.steps import drain

    passes: list[int] = []
    real = service_module.reservation_ids

    def counted(objects: list[dict]) -> set[str]:
        passes.append(len(objects))
        return real(objects)

    monkeypatch.setattr(service_module, "reservation_ids", counted)
    nodes = cluster(2, 8)
    s = svc(nodes)
    stored = _stored_pod(s, 2)
    rid = stored["metadata"]["labels"]["gpuledger.io/reservation-id"]
    assert s.status()["pending"] == 1
    drain(s.resync_in_steps([*nodes, stored], NOW + 1, step=1))
    assert passes == [1, 1, 1]  # one slice per step, over every object
    assert s.status()["pending"] == 0 and s.lookup([rid])[0].confirmed
    passes.clear()
    drain(s.resync_in_steps([*nodes, stored], NOW + 2, step=1))
    s.resync([*nodes, stored], NOW + 3)
    assert passes == [] and s.lookup([rid])[0].confirmed
