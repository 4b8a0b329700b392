"""Placement integrity as a property: whatever admissions, deletes, copies, tampered annotations and restarts
happen, a ledger rebuilt from the stored pods equals the live one, and no device is held twice."""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Placement, Request
from gpuledger.core.pods.placement_codec import Binding, encode_placement
from gpuledger.names import PLACEMENT_ANNOTATION, RESERVATION_ID_KEY
from tests.core.core_factory import node, rebuilt_the_long_way, rebuilt_without_adopting_at_once

KEY = b"integrity-test-key"
NODES = [node("n1", gpus=4), node("n2", gpus=4)]
OWNER_UID = "rs-uid-1"


def config() -> LedgerConfig:
    return LedgerConfig(placement_key=KEY)


def stored_pod(
    name: str, namespace: str, p: Placement, annotation: str, created: int, uid: str, owner_uid: str = ""
) -> dict:
    meta = {
        "name": name,
        "namespace": namespace,
        "uid": uid,
        "creationTimestamp": f"2026-01-01T00:00:{created:02d}Z",
        "annotations": {PLACEMENT_ANNOTATION: annotation},
        "labels": {RESERVATION_ID_KEY: p.id},
    }
    if owner_uid:
        meta["ownerReferences"] = [{"kind": "ReplicaSet", "name": "rs", "uid": owner_uid, "controller": True}]
    gpus = str(len(p.devices))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeName": p.node,
            "containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": gpus}}}],
        },
        "status": {"phase": "Running"},
    }


def holders_by_device(snap: dict) -> dict[tuple[str, int], list[str]]:
    out: dict[tuple[str, int], list[str]] = {}
    for hid, (node_name, devices, shares, *_rest) in snap["holdings"].items():
        for d in list(devices) + [s[0] for s in shares]:
            out.setdefault((node_name, d), []).append(hid)
    return out


def check(live: Ledger, stored: dict[str, dict], order) -> None:
    snap = live.snapshot()
    rebuilt = Ledger.rebuild(NODES + order, config()).snapshot()
    assert rebuilt == snap
    assert rebuilt_the_long_way(NODES + order, config()) == snap  # the shortcuts changes nothing
    assert rebuilt_without_adopting_at_once(NODES + order, config()) == snap
    for where, hids in holders_by_device(snap).items():
        assert len(hids) == 1, f"{where} held by {hids}"
    for name, n in snap["nodes"].items():
        for index, _free, _mem, owner, shares in n["devices"]:
            assert not (owner and shares), f"{name}:{index} held whole and shared"


def verified_devices(stored: dict[str, dict]) -> set[tuple[str, int]]:
    """Devices named by a validly signed placement on any stored pod (copies and foreign holders included)."""
    from gpuledger.core.pods.placement_codec import decode_placement

    out = set()
    for pod in stored.values():
        p = decode_placement(pod["metadata"]["annotations"][PLACEMENT_ANNOTATION], KEY)
        if p is not None:
            out.update((p.node, d) for d in p.devices)
    return out


OPS = st.sampled_from(
    ["admit", "admit", "admit_generated", "delete", "delete", "copy", "copy", "tamper", "touch", "restart"]
)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_rebuild_equals_live_and_no_device_is_held_twice(data):
    live = Ledger.rebuild(NODES, config())
    stored: dict[str, dict] = {}  # pod key -> the stored pod
    serial = 0
    for _ in range(data.draw(st.integers(1, 24), label="steps")):
        op = data.draw(OPS, label="op")
        serial += 1
        now = float(serial)
        created = data.draw(st.integers(0, 9), label="created")  # small range: ties happen, uids break them
        uid = f"u{data.draw(st.integers(0, 99), label='uid'):02d}-{serial}"
        if op in ("admit", "admit_generated"):
            p = live.reserve(Request(f"r{serial}", gpus=data.draw(st.integers(1, 3), label="gpus")), now)
            if not isinstance(p, Placement):
                continue
            assert not {(p.node, d) for d in p.devices} & verified_devices(stored), "a stored pod names it"
            if op == "admit":
                name, binding, owner = f"p{serial}", Binding("team", f"p{serial}"), ""
            else:  # named by generateName after admission: bound to the namespace and the controller's uid
                name, binding, owner = (
                    f"web-{serial}",
                    Binding("team", generate_name="web-", owner_uid=OWNER_UID),
                    OWNER_UID,
                )
            pod = stored_pod(name, "team", p, encode_placement(p, KEY, binding), created, uid, owner)
            stored[f"team/{name}"] = pod
            live.apply_object(pod, now)
        elif op == "delete" and stored:
            key = data.draw(st.sampled_from(sorted(stored)), label="delete")
            live.delete_object(stored.pop(key))
        elif op in ("copy", "tamper") and stored:
            key = data.draw(st.sampled_from(sorted(stored)), label="source")
            source = stored[key]
            annotation = source["metadata"]["annotations"][PLACEMENT_ANNOTATION]
            from gpuledger.core.pods.placement_codec import decode_placement

            p = decode_placement(annotation, KEY)
            if p is None:
                continue
            namespace = data.draw(st.sampled_from(["team", "plain"]), label="namespace")
            name = f"copy-{serial}"
            owner = ""
            if op == "tamper":
                d = json.loads(annotation)
                d["devices"] = [(x + 1) % 4 for x in d.get("devices", [])]
                annotation = json.dumps(d, sort_keys=True, separators=(",", ":"))
            else:
                how = data.draw(st.sampled_from(["verbatim", "rebound", "same_owner"]), label="binding")
                if how == "rebound":  # validly signed for the copy itself: a second valid holder of the id
                    annotation = encode_placement(p, KEY, Binding(namespace, name))
                elif how == "same_owner":  # a generateName sibling: same namespace and controller
                    name, namespace, owner = f"web-copy-{serial}", "team", OWNER_UID
                    annotation = encode_placement(
                        p, KEY, Binding("team", generate_name="web-", owner_uid=OWNER_UID)
                    )
            pod = stored_pod(name, namespace, p, annotation, created, uid, owner)
            stored[f"{namespace}/{name}"] = pod
            live.apply_object(pod, now)
        elif op == "touch" and stored:
            key = data.draw(st.sampled_from(sorted(stored)), label="touch")
            live.apply_object(stored[key], now)
        elif op == "restart":
            live = Ledger.rebuild(
                NODES + data.draw(st.permutations(list(stored.values())), label="list"), config(), now
            )
        order = data.draw(st.permutations(list(stored.values())), label="rebuild order")
        check(live, stored, order)


def test_a_copy_keeps_the_device_after_its_original_goes():
    """A pod copied into a plain namespace, in the core: the copy holds the device by identity."""
    live = Ledger.rebuild(NODES[:1], config())
    p = live.reserve(Request("r1", gpus=1), 0.0)
    original = stored_pod("orig", "team", p, encode_placement(p, KEY, Binding("team", "orig")), 0, "u1")
    copy = stored_pod("copy", "plain", p, original["metadata"]["annotations"][PLACEMENT_ANNOTATION], 1, "u2")
    live.apply_object(original, 1.0)
    live.apply_object(copy, 1.0)
    node_state = live.snapshot()["nodes"]["n1"]
    assert node_state["devices"][p.devices[0]][3] == "r1" and node_state["unknown_gpus"] == 1
    assert [c[:2] for c in live.conflicts()] == [["plain/copy", "r1"]]
    assert "metadata.namespace 'plain'" in live.conflicts()[0][2]
    live.delete_object(original)
    assert live.snapshot()["nodes"]["n1"]["devices"][p.devices[0]][3] == "foreign:plain/copy"
    nxt = live.reserve(Request("r2", gpus=1), 2.0)
    assert nxt.devices != p.devices
    live.release("r2")  # never stored: a rebuild would not know it
    assert Ledger.rebuild([*NODES[:1], copy], config()).snapshot() == live.snapshot()


def test_a_pod_created_right_after_a_delete_gets_the_freed_gpu():
    live = Ledger.rebuild([node("n1", gpus=1)], config())
    p = live.reserve(Request("r1", gpus=1), 0.0)
    pod = stored_pod("first", "team", p, encode_placement(p, KEY, Binding("team", "first")), 0, "u1")
    live.apply_object(pod, 0.5)
    assert not isinstance(live.reserve(Request("r2", gpus=1), 1.0), Placement)  # full
    live.delete_object(pod)
    again = live.reserve(Request("r3", gpus=1), 1.0)
    assert isinstance(again, Placement) and again.devices == p.devices


def test_the_earliest_bound_holder_owns_and_the_next_takes_over():
    live = Ledger.rebuild(NODES[:1], config())
    p = live.reserve(Request("r1", gpus=1), 0.0)
    late = stored_pod("late", "team", p, encode_placement(p, KEY, Binding("team", "late")), 5, "u9")
    early = stored_pod("early", "team", p, encode_placement(p, KEY, Binding("team", "early")), 3, "u1")
    live.apply_object(late, 1.0)
    live.apply_object(early, 1.0)
    assert [c[0] for c in live.conflicts()] == ["team/late"]
    assert "belongs to pod team/early" in live.conflicts()[0][2]
    assert Ledger.rebuild([*NODES[:1], early, late], config()).snapshot() == live.snapshot()
    live.delete_object(early)  # the device stays held: the other holder owns it now
    assert live.get("r1") == p and live.conflicts() == []
    assert live.snapshot()["nodes"]["n1"]["devices"][p.devices[0]][3] == "r1"
    assert Ledger.rebuild([*NODES[:1], late], config()).snapshot() == live.snapshot()
