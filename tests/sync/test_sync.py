"""Cluster sync against the real kube-apiserver: what reaches the ledger, in what batches,
and when it resyncs.

The target here records the calls the Ray actor would receive (same method names and arguments), so these
tests pin the sync's own behaviour; tests/test_sync_ledger.py drives a real Ledger through the same path.
"""

from __future__ import annotations

import threading
import time
import uuid

import pytest

from devcluster.cluster import WEBHOOK_USER
from devcluster.nodes import create_nodes, make_node, patch_node
from gpuledger.names import RESERVATION_ID_KEY
from gpuledger.service.sync_writer import SyncFenced, SyncWriter
from gpuledger.sync.cluster_sync import ClusterSync, slim
from gpuledger.sync.config import SyncConfig

pytestmark = pytest.mark.e2e


class RecordingTarget:
    """Records every batched call; `fail_next` makes the next call raise, `synced` is what status()
    reports. The sync lease is the ledger's own (gpuledger.service.sync_writer), on `clock`."""

    def __init__(self):
        self.lock = threading.Lock()
        self.writer = SyncWriter(incarnation="recording")
        self.clock = 1000.0
        self.holders: list[str | None] = []  # who made each write
        self.asked: dict[str, int] = {}  # lease calls by holder
        self.events: list[tuple[str, dict]] = []
        self.batches: list[int] = []
        self.resyncs: list[list[dict]] = []
        self.confirmed: list[str] = []
        self.released: list[str] = []
        self.candidates: list[str] = []
        self.synced = True
        self.fail_next = 0

    def _maybe_fail(self):
        with self.lock:
            if self.fail_next:
                self.fail_next -= 1
                raise ConnectionError("ledger actor unavailable (restarting)")

    def apply_events(self, events, holder):
        self._maybe_fail()
        with self.lock:
            self.writer.check(holder, self.clock, "apply_events")
            self.holders.append(holder)
            self.events.extend(events)
            self.batches.append(len(events))

    def resync(self, objects, holder):
        self._maybe_fail()
        with self.lock:
            self.writer.check(holder, self.clock, "resync", listing=True)
            self.writer.listed_by(holder, self.clock)
            self.holders.append(holder)
            self.resyncs.append(list(objects))
            self.synced = True

    def sync_lease(self, holder, term_s, hand_back=False):
        with self.lock:
            self.asked[holder] = self.asked.get(holder, 0) + 1
            if hand_back:
                return self.writer.hand_back(holder, self.clock)
            return self.writer.acquire(holder, self.clock, term_s)

    def expiry_candidates(self, now):
        with self.lock:
            out, self.candidates = self.candidates, []
            return out

    def confirm(self, ids, holder):
        with self.lock:
            self.writer.check(holder, self.clock, "confirm")
            self.confirmed.extend(ids)

    def release(self, ids, holder):
        with self.lock:
            self.writer.check(holder, self.clock, "release")
            self.released.extend(ids)

    def status(self):
        return {"ready": True, "synced": self.synced}

    def place_waiting(self, holder):  # no pod waits in these tests (gpuledger.sync.placer)
        return []

    def preemptions_due(self, holder):  # no queue, no plan (gpuledger.sync.evictor)
        return []

    def eviction_refused(self, refusals, holder):
        raise AssertionError(f"no eviction was asked for, yet {refusals} were refused")

    def queue_status(self, holder):  # no GPUQueue (gpuledger.sync.queue_status)
        return {}

    def seen(self, etype: str, kind: str, name: str) -> bool:
        with self.lock:
            return any(
                t == etype and o.get("kind") == kind and o["metadata"]["name"] == name for t, o in self.events
            )


def pod(name: str, labels: dict | None = None, node: str | None = None) -> dict:
    spec = {
        "containers": [{"name": "c", "image": "busybox", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]
    }
    if node:
        spec["nodeName"] = node
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {}},
        "spec": spec,
    }


@pytest.fixture
def plain_ns(apiserver):
    """A namespace outside admission: these pods reach the sync without any webhook."""
    name = f"sync-{uuid.uuid4().hex[:6]}"
    apiserver.create_namespace(name, admission=False)
    return name


@pytest.fixture
def core(apiserver):
    from kubernetes import client

    return client.CoreV1Api(apiserver.api_client())


@pytest.fixture
def running(apiserver):
    """A started sync over a recording target; stopped after the test."""
    target = RecordingTarget()
    sync = ClusterSync(
        apiserver.api_client(WEBHOOK_USER),
        target,
        SyncConfig(expiry_interval_s=3600, status_interval_s=0.2, retry_backoff_s=(0.05, 0.5)),
    )
    sync.start()
    assert sync.wait_synced(30), sync.stats
    yield sync, target
    sync.stop()


def test_slim_drops_managed_fields_and_names_the_kind():
    obj = {"metadata": {"name": "p", "managedFields": [{"manager": "kubectl"}]}, "spec": {}}
    out = slim(obj, "Pod")
    assert out == {"metadata": {"name": "p"}, "spec": {}, "kind": "Pod", "apiVersion": "v1"}
    assert "managedFields" in obj["metadata"]  # the input is not mutated


def test_initial_resync_lists_nodes_and_pods(apiserver, core, plain_ns):
    node = make_node(f"sync-init-{uuid.uuid4().hex[:5]}", "spine-9", "leaf-90")
    create_nodes(apiserver.api_client(), [node])
    core.create_namespaced_pod(plain_ns, pod("before-start"))
    target = RecordingTarget()
    with ClusterSync(apiserver.api_client(), target) as sync:
        assert sync.wait_synced(30)
        objects = target.resyncs[0]
    names = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert ("Node", node["metadata"]["name"]) in names
    assert ("Pod", "before-start") in names
    listed = next(o for o in objects if o["metadata"]["name"] == node["metadata"]["name"])
    assert listed["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert all("managedFields" not in o["metadata"] for o in objects)


def test_pod_and_node_changes_are_forwarded(apiserver, core, plain_ns, running):
    sync, target = running
    name = f"sync-node-{uuid.uuid4().hex[:5]}"
    create_nodes(apiserver.api_client(), [make_node(name, "spine-9", "leaf-91")])
    core.create_namespaced_pod(plain_ns, pod("p1", node=name))
    apiserver.wait_for(lambda: target.seen("ADDED", "Pod", "p1"), what="pod ADDED")
    apiserver.wait_for(lambda: target.seen("ADDED", "Node", name), what="node ADDED")

    patch_node(apiserver.api_client(), name, {"spec": {"unschedulable": True}})
    apiserver.wait_for(
        lambda: any(
            t == "MODIFIED" and o["metadata"]["name"] == name and o["spec"].get("unschedulable")
            for t, o in list(target.events)
        ),
        what="cordon MODIFIED",
    )
    apiserver.force_delete("pod", "p1", namespace=plain_ns)
    apiserver.wait_for(lambda: target.seen("DELETED", "Pod", "p1"), what="pod DELETED")
    assert len(target.resyncs) == 1  # nothing above needed a rebuild


def test_pod_added_listeners_see_each_new_pod_once_and_a_failing_one_stops_nothing(
    apiserver, core, plain_ns, running
):
    """What the webhook's Events use to find placed pods without a LIST (gpuledger/webhook/kube/events.py)."""
    sync, target = running
    seen: list[str] = []

    def broken(pod: dict) -> None:
        raise RuntimeError("a listener's bug")

    sync.on_pod_added.extend([broken, lambda p: seen.append(p["metadata"]["name"])])
    core.create_namespaced_pod(plain_ns, pod("added-1", labels={RESERVATION_ID_KEY: "rid-added-1"}))
    core.patch_namespaced_pod("added-1", plain_ns, {"metadata": {"labels": {"touched": "yes"}}})
    core.create_namespaced_pod(plain_ns, pod("added-2"))
    apiserver.wait_for(lambda: target.seen("ADDED", "Pod", "added-2"), what="second pod ADDED")
    apiserver.wait_for(
        lambda: any(t == "MODIFIED" and o["metadata"]["name"] == "added-1" for t, o in list(target.events)),
        what="the patch MODIFIED",
    )
    # the listeners run on the sync's own thread after the target was handed the event: wait for them too
    apiserver.wait_for(lambda: "added-2" in seen, what="the listener told of the second pod")
    assert seen == ["added-1", "added-2"]  # ADDED only, each once, past the listener that raised
    assert len(target.resyncs) == 1 and sync.stats.watch_errors == 0  # the watch never broke


def test_events_arrive_in_batches(apiserver, core, plain_ns, running):
    sync, target = running
    for i in range(60):
        core.create_namespaced_pod(plain_ns, pod(f"b{i}"))
    apiserver.wait_for(lambda: all(target.seen("ADDED", "Pod", f"b{i}") for i in range(60)), what="60 pods")
    assert sync.stats.batches < sync.stats.events_applied  # at least one call carried several events


def test_apiserver_restart_410_gone_leads_to_full_resync():
    """A restarted API server's watch cache starts over: resuming watches get 410 Gone and the sync relists.

    Its own control plane (no controllers; a few seconds) so that the shared one never restarts under others.
    """
    from kubernetes import client

    from devcluster.cluster import ControlPlane
    from tests.conftest import require_binaries

    require_binaries(with_controllers=False)
    with ControlPlane(with_controllers=False) as cp:
        cp.create_namespace("restart", admission=False)
        core = client.CoreV1Api(cp.api_client())
        core.create_namespaced_pod("restart", pod("before"))
        target = RecordingTarget()
        config = SyncConfig(status_interval_s=0.2, retry_backoff_s=(0.05, 0.5), expiry_interval_s=3600)
        with ClusterSync(cp.api_client(), target, config) as sync:
            assert sync.wait_synced(30)
            cp.wait_for(lambda: target.resyncs, what="first list")
            for i in range(20):  # move etcd's revision past the one the watches resume from
                core.create_namespaced_pod("restart", pod(f"churn-{i}"))
            cp.wait_for(lambda: target.seen("ADDED", "Pod", "churn-19"), what="churn events")
            cp.restart_apiserver()
            core = client.CoreV1Api(cp.api_client())
            core.create_namespaced_pod("restart", pod("after-restart"))
            cp.wait_for(lambda: len(target.resyncs) >= 2, timeout=60, what="resync after restart")
            assert sync.stats.gone >= 1, sync.stats
            assert any("410" in r for r in sync.stats.resync_reasons)
            # nothing lost: the pod created while the watch was down is either in the relist or an event
            cp.wait_for(
                lambda: (
                    target.seen("ADDED", "Pod", "after-restart")
                    or any(o["metadata"]["name"] == "after-restart" for o in target.resyncs[-1])
                ),
                what="pod created across the restart",
            )


def test_ledger_restart_triggers_resync(apiserver, core, plain_ns, running):
    sync, target = running
    before = len(target.resyncs)
    target.synced = False  # what a freshly restarted actor reports
    apiserver.wait_for(lambda: len(target.resyncs) > before, what="resync after ledger restart")
    assert "ledger restarted empty" in sync.stats.resync_reasons


def test_failed_ledger_call_is_followed_by_resync(apiserver, core, plain_ns, running):
    sync, target = running
    before = len(target.resyncs)
    target.fail_next = 2  # the batch and the first resync attempt fail
    core.create_namespaced_pod(plain_ns, pod("during-outage"))
    apiserver.wait_for(lambda: len(target.resyncs) > before, timeout=30, what="resync after ledger outage")
    # the pod whose event was lost with the failed batch is in the rebuild
    assert any(o["metadata"]["name"] == "during-outage" for o in target.resyncs[-1])
    assert sync.stats.target_errors >= 2


def test_expiry_confirms_stored_pods_and_releases_the_rest(apiserver, core, plain_ns):
    target = RecordingTarget()
    sync = ClusterSync(apiserver.api_client(), target)
    stored = f"r-{uuid.uuid4().hex}"
    core.create_namespaced_pod(plain_ns, pod("carrier", labels={RESERVATION_ID_KEY: stored}))
    target.candidates = [stored, "r-never-stored", "id with spaces"]
    # as a started sync's lease thread and first list would
    target.writer.acquire(sync.identity, target.clock)
    target.writer.listed_by(sync.identity, target.clock)
    confirmed, released = sync.expiry.check_expiry(time.time())
    assert confirmed == [stored] and target.confirmed == [stored]
    assert released == ["r-never-stored", "id with spaces"] == target.released


def test_stop_ends_threads_promptly(apiserver):
    sync = ClusterSync(apiserver.api_client(), RecordingTarget()).start()
    assert sync.wait_synced(30)
    started = time.monotonic()
    sync.stop()
    assert all(not t.is_alive() for t in sync._threads)
    assert time.monotonic() - started < 5


def _lease_config() -> SyncConfig:
    return SyncConfig(
        expiry_interval_s=3600, status_interval_s=0.2, retry_backoff_s=(0.05, 0.5), lease_renew_s=0.1
    )


def _writes_of(target: RecordingTarget, identity: str) -> int:
    with target.lock:
        return sum(h == identity for h in target.holders)


def test_of_two_replicas_syncs_one_writes_and_the_other_takes_over_when_it_stops(apiserver, core, plain_ns):
    """Every replica runs a sync; only the lease holder's stream reaches the ledger, and a replica that stops
    hands the lease back: the other lists first, then streams."""
    target = RecordingTarget()
    first = ClusterSync(apiserver.api_client(WEBHOOK_USER), target, _lease_config(), identity="replica-1")
    second = ClusterSync(apiserver.api_client(WEBHOOK_USER), target, _lease_config(), identity="replica-2")
    with first:
        assert first.wait_synced(30), first.stats
        second.start()
        apiserver.wait_for(lambda: target.asked.get("replica-2", 0) >= 2, what="the second sync asking")
        # its watches resume from a version listed before the pod below exists: it sees the pod's events
        apiserver.wait_for(lambda: second._resume_from["Pod"] is not None, what="the standby's watch")
        core.create_namespaced_pod(plain_ns, pod("seen-once"))
        apiserver.wait_for(lambda: target.seen("ADDED", "Pod", "seen-once"), what="the holder's event")
        apiserver.wait_for(lambda: second.stats.events_dropped >= 1, what="the standby's copy dropped")
        assert first.leading and not second.leading and target.writer.holder == "replica-1"
        assert _writes_of(target, "replica-2") == 0
        with target.lock:
            assert [o["metadata"]["name"] for t, o in target.events].count("seen-once") == 1
    # first stopped: it handed the lease back, and the second takes it within a renewal
    assert not first.leading and target.writer.holder in ("", "replica-2")
    try:
        apiserver.wait_for(lambda: second.leading and second.wait_synced(0), what="takeover")
        assert second.stats.lease_taken == 1 and "took the sync lease (term 2)" in second.stats.resync_reasons
        with target.lock:
            assert target.holders[-1] == "replica-2" and len(target.resyncs) == 2  # its list came first
        core.create_namespaced_pod(plain_ns, pod("after-takeover"))
        apiserver.wait_for(lambda: target.seen("ADDED", "Pod", "after-takeover"), what="the new holder's")
    finally:
        second.stop()
    assert target.writer.holder == ""


def test_a_silent_holder_loses_the_lease_after_its_term_and_its_late_writes_are_refused(
    apiserver, core, plain_ns
):
    """A replica that dies without handing back: its term runs out (the ledger's clock, moved here), a standby
    takes the lease and lists, and anything the old holder still sends is refused."""
    target = RecordingTarget()
    config = _lease_config()
    dead = ClusterSync(apiserver.api_client(WEBHOOK_USER), target, config, identity="replica-dead")
    dead.start()
    assert dead.wait_synced(30)
    dead.stop(hand_back=False)  # as a crash: the lease is still its own
    standby = ClusterSync(apiserver.api_client(WEBHOOK_USER), target, config, identity="replica-live")
    with standby:
        apiserver.wait_for(lambda: target.asked.get("replica-live", 0) >= 2, what="the standby asking")
        core.create_namespaced_pod(plain_ns, pod("while-leaderless"))
        assert not standby.leading
        with target.lock:
            target.clock += config.lease_term_s  # the dead holder's term ends
        apiserver.wait_for(lambda: standby.leading and standby.wait_synced(0), what="takeover after the term")
        with target.lock:  # the pod created while nobody wrote is in the new holder's list
            assert any(o["metadata"]["name"] == "while-leaderless" for o in target.resyncs[-1])
        with pytest.raises(SyncFenced, match="apply_events from 'replica-dead'"):
            target.apply_events([("DELETED", pod("while-leaderless"))], "replica-dead")
        with pytest.raises(SyncFenced, match="release from 'replica-dead'"):
            target.release(["r-any"], "replica-dead")


def test_a_refused_write_makes_the_sync_stand_by_and_list_again_when_it_leads_again(
    apiserver, core, plain_ns
):
    """A write refused (here: the ledger restarted and nobody holds the lease) wakes the lease thread at once,
    which never renews on its own in this test: the sync takes a new term and lists before streaming again."""
    target = RecordingTarget()
    config = _lease_config()
    config.lease_renew_s = 3600
    with ClusterSync(apiserver.api_client(WEBHOOK_USER), target, config) as sync:
        assert sync.wait_synced(30)
        before = len(target.resyncs)
        with target.lock:
            target.writer.hand_back(sync.identity, target.clock)
        core.create_namespaced_pod(plain_ns, pod("fenced-then-listed"))
        apiserver.wait_for(lambda: len(target.resyncs) > before, what="a new term's list")
        assert sync.stats.fenced == 1 and sync.leading and sync.stats.lease_taken == 2, sync.stats
        apiserver.wait_for(
            lambda: (
                target.seen("ADDED", "Pod", "fenced-then-listed")
                or any(o["metadata"]["name"] == "fenced-then-listed" for o in target.resyncs[-1])
            ),
            what="the pod, in the list or as an event",
        )
