"""The ledger's sync lease: one cluster sync writes at a time, a new holder lists first, and the writes of any
other (a lagging replica's stale stream) are refused. Time is an input: terms end by moving `now`."""

from __future__ import annotations

import pytest

from gpuledger.core.model import Placement
from gpuledger.core.pods.placement_codec import binding_of, encode_placement
from gpuledger.core.pods.request import request_from_pod
from gpuledger.names import PLACEMENT_ANNOTATION, RESERVATION_ID_KEY
from gpuledger.service.ledger_service import AdmitCall, LedgerService
from gpuledger.service.sync_writer import SyncFenced, SyncWriter, check_term, is_fenced
from tests.webhook.webhook_support import cluster, config, gpu_pod, service

T = 1000.0


def test_the_first_to_ask_holds_it_others_wait_for_its_term_to_end():
    w = SyncWriter(incarnation="i1")
    a = w.acquire("a", T, 30.0)
    assert a == {
        "held": True,
        "holder": "a",
        "incarnation": "i1",
        "epoch": 1,
        "listed": False,
        "expires_in": 30.0,
    }
    b = w.acquire("b", T + 10, 30.0)
    assert not b["held"] and b["holder"] == "a" and b["epoch"] == 1
    assert w.acquire("a", T + 20, 30.0)["expires_in"] == 30.0  # renewed: the same term
    assert w.epoch == 1
    assert not w.acquire("b", T + 49.9, 30.0)["held"]
    b = w.acquire("b", T + 50, 30.0)  # a silent holder's term ended
    assert b["held"] and b["epoch"] == 2 and not b["listed"]


def test_a_holder_whose_term_lapsed_starts_a_new_term_even_unopposed():
    w = SyncWriter()
    w.acquire("a", T, 10.0)
    w.listed_by("a", T)
    again = w.acquire("a", T + 11, 10.0)  # its stream may have missed events while it was silent
    assert again["held"] and again["epoch"] == 2 and not again["listed"]


def test_a_holder_that_hands_it_back_frees_it_at_once():
    w = SyncWriter()
    w.acquire("a", T, 30.0)
    assert not w.hand_back("b", T)["held"] and w.holder == "a"  # only the holder can
    assert w.hand_back("a", T + 1) == {
        "held": False,
        "holder": "",
        "incarnation": "",
        "epoch": 1,
        "listed": False,
        "expires_in": 0.0,
    }
    assert w.acquire("b", T + 1, 30.0)["held"]


def test_writes_need_the_lease_and_a_full_list_first():
    w = SyncWriter()
    with pytest.raises(
        SyncFenced, match=r"apply_events from 'a', which does not hold .* \(nobody holds it\)"
    ):
        w.check("a", T, "apply_events")
    w.acquire("a", T, 30.0)
    with pytest.raises(SyncFenced, match="apply_events from 'a' before its full list"):
        w.check("a", T, "apply_events")
    w.check("a", T, "resync", listing=True)
    w.listed_by("a", T + 25)  # a long rebuild: the term runs from its end
    w.check("a", T + 50, "apply_events")
    with pytest.raises(SyncFenced, match=r"confirm from 'b', .* \('a' holds it\)"):
        w.check("b", T + 50, "confirm")
    with pytest.raises(SyncFenced, match="without a sync identity while 'a' holds"):
        w.check(None, T + 50, "apply_events")
    with pytest.raises(SyncFenced, match="nobody holds it"):
        w.check("a", T + 55, "apply_events")  # its term ended: refused until it asks again (and lists)
    w.check(None, T + 55, "apply_events")  # nobody holds it: an in-process caller with no identity may


@pytest.mark.parametrize("term", [0, -1, 601, "30", True, float("nan")])
def test_a_bad_term_or_holder_is_refused_by_name(term):
    with pytest.raises(ValueError, match=r"sync lease term .*expected seconds, more than 0 and at most 600"):
        check_term(term)


def test_an_empty_holder_is_refused():
    with pytest.raises(ValueError, match="sync lease holder '': expected the sync's identity"):
        SyncWriter().acquire("", T)


def test_a_refusal_is_recognised_through_ray_and_the_channel():
    assert is_fenced(SyncFenced("x"))
    assert is_fenced(RuntimeError("ledger apply_events failed: SyncFenced: apply_events from 'a' ..."))
    assert not is_fenced(ConnectionError("ledger actor unavailable"))


def _stored(svc, key, rid: str, uid: str) -> tuple[dict, Placement]:
    """A pod `ml/web-0` admitted as `rid`, as the API stores it (the placement on it, its own uid)."""
    pod = gpu_pod(1, name="web-0", namespace="ml")
    [placed] = svc.admit([AdmitCall(request_from_pod(pod, None, None, rid, namespace="ml"))], T)
    assert isinstance(placed, Placement), placed
    annotation = encode_placement(placed, key, binding_of(pod, "ml"))
    pod["metadata"]["annotations"][PLACEMENT_ANNOTATION] = annotation
    pod["metadata"]["labels"] = {RESERVATION_ID_KEY: rid}
    pod["metadata"]["uid"] = uid
    pod["spec"]["nodeName"] = placed.node
    return pod, placed


def test_a_lagging_replicas_stale_delete_cannot_free_a_gpu_twice():
    """The race that needs the lease. One node, one GPU; two replicas' syncs see the same pods.
    web-0 is deleted, a new web-0 (a StatefulSet's) is placed on the freed GPU and stored; then the lagging
    replica delivers the first web-0's DELETED. Taken from anyone, it frees the GPU the new web-0 holds and a
    third pod is admitted onto it. From a sync that does not hold the lease it is refused."""
    cfg = config()
    svc = service(cluster(1, 1), cfg)  # the file source: no lease held, the service rebuilt itself
    key = cfg.placement_key()
    assert svc.sync_lease("replica-a", T)["held"]
    assert not svc.sync_lease("replica-b", T)["held"]
    nodes = [o for o in cluster(1, 1) if o.get("kind") == "Node"]
    svc.resync(nodes, T, "replica-a")
    first, _ = _stored(svc, key, "r1", "uid-1")
    svc.apply_events([("ADDED", first)], T + 1, "replica-a")
    svc.apply_events([("DELETED", first)], T + 2, "replica-a")
    second, placed = _stored(svc, key, "r2", "uid-2")  # the GPU the first one freed
    svc.apply_events([("ADDED", second)], T + 3, "replica-a")
    with pytest.raises(SyncFenced, match="apply_events from 'replica-b'"):
        svc.apply_events([("DELETED", first)], T + 3.1, "replica-b")  # the lagging replica's stale event
    with pytest.raises(SyncFenced, match="without a sync identity"):
        svc.apply_events([("DELETED", first)], T + 3.1)
    third = gpu_pod(1, name="other", namespace="ml")
    [answer] = svc.admit([AdmitCall(request_from_pod(third, None, None, "r3", namespace="ml"))], T + 4)
    assert not isinstance(answer, Placement)  # denied: the only GPU is web-0's
    assert svc.lookup(["r2"])[0].confirmed and placed.devices == svc.lookup(["r2"])[0].placement.devices
    status = svc.status()
    assert (status["sync_holder"], status["sync_epoch"], status["sync_listed"]) == ("replica-a", 1, True)


def test_a_new_holder_writes_only_after_its_full_list_and_the_old_ones_writes_are_refused():
    cfg = config()
    svc = service(cluster(1, 2), cfg)
    key = cfg.placement_key()
    nodes = [o for o in cluster(1, 2) if o.get("kind") == "Node"]
    svc.sync_lease("replica-a", T, 10.0)
    svc.resync(nodes, T, "replica-a")
    pod, _ = _stored(svc, key, "r1", "uid-1")
    svc.apply_events([("ADDED", pod)], T + 1, "replica-a")
    assert svc.sync_lease("replica-b", T + 11, 10.0)["held"]  # replica-a went silent for its term
    with pytest.raises(SyncFenced, match="before its full list"):
        svc.apply_events([("DELETED", pod)], T + 12, "replica-b")
    with pytest.raises(SyncFenced, match="release from 'replica-a'"):
        svc.release(["r1"], T + 12, "replica-a")
    with pytest.raises(SyncFenced, match="resync from 'replica-a'"):
        svc.resync(nodes, T + 12, "replica-a")
    report = svc.resync([*nodes, pod], T + 12, "replica-b")
    assert report["objects"] == 2 and svc.lookup(["r1"])[0].confirmed
    assert svc.apply_events([("DELETED", pod)], T + 13, "replica-b") == 1
    assert svc.lookup(["r1"]) == [None]
    assert svc.release(["nothing"]) == [False]  # the webhook's own release names no holder: never fenced


def test_a_restarted_ledger_starts_a_new_term_for_the_same_holder():
    """Ray restarts the actor empty: its epochs start again, so a term is (incarnation, epoch)."""
    source = {"kind": "objects", "objects": cluster(1, 1)}
    first = LedgerService(config().ledger_config(), source, now=T, incarnation="one")
    again = LedgerService(config().ledger_config(), source, now=T, incarnation="two")
    a1, a2 = first.sync_lease("replica-a", T), again.sync_lease("replica-a", T)
    assert a1["epoch"] == a2["epoch"] == 1 and (a1["incarnation"], a2["incarnation"]) == ("one", "two")
