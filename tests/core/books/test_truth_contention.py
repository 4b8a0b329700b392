"""Owners of different reservation ids naming one device (the second admitted while the kubelet's truth had
moved the first elsewhere, then the truth changed again): the device goes to the earlier claim (creation time,
uid, key) whatever order the events or the rebuild's list came in, and the other is adopted once it frees."""

from __future__ import annotations

import itertools
import json

from gpuledger.core.ledger import Ledger
from gpuledger.core.model import Placement, Request
from gpuledger.core.pods.placement_codec import Binding, encode_placement
from gpuledger.names import HOLDERS_ANNOTATION
from tests.core.books.test_integrity_properties import KEY, config, stored_pod
from tests.core.core_factory import node


def n1(holders: dict[int, str] | None) -> dict:
    obj = node("n1", gpus=4)
    if holders is not None:
        annotation = {
            "v": 1,
            "source": "podresources",
            "holders": {
                str(d): [{"namespace": k.split("/")[0], "pod": k.split("/")[1], "container": "c"}]
                for d, k in holders.items()
            },
            "external": {},
            "unmapped": [],
        }
        obj["metadata"]["annotations"][HOLDERS_ANNOTATION] = json.dumps(annotation)
    return obj


def admit(live: Ledger, name: str, created: int, now: float) -> tuple[Placement, dict]:
    p = live.reserve(Request(f"r-{name}", gpus=1), now)
    assert isinstance(p, Placement)
    obj = stored_pod(name, "team", p, encode_placement(p, KEY, Binding("team", name)), created, f"u-{name}")
    live.apply_object(obj, now)
    return p, obj


def owner_of(snap: dict, device: int) -> str | None:
    return next(d[3] for d in snap["nodes"]["n1"]["devices"] if d[0] == device)


def contended(first_created: int, second_created: int) -> tuple[Ledger, Placement, dict, dict, dict]:
    live = Ledger.rebuild([n1(None)], config())
    p1, a = admit(live, "a", first_created, 1.0)
    moved = 3 if p1.devices != (3,) else 2
    live.apply_object(n1({moved: "team/a"}), 2.0)  # the kubelet gave pod a another device
    p2, b = admit(live, "b", second_created, 3.0)
    assert p2.devices == p1.devices  # the ledger let b take the device a left
    truth = n1({})  # the kubelet no longer lists a: a's placement names b's device again
    live.apply_object(truth, 4.0)
    return live, p1, a, b, truth


def test_the_earlier_claim_holds_the_device_live_and_rebuilt():
    for first, second, winner in ((5, 1, "r-b"), (1, 5, "r-a")):
        live, p1, a, b, truth = contended(first, second)
        snap = live.snapshot()
        assert owner_of(snap, p1.devices[0]) == winner
        assert snap["nodes"]["n1"]["unknown_gpus"] == 1  # the other is counted instead
        for order in itertools.permutations([truth, a, b]):
            assert Ledger.rebuild(list(order), config()).snapshot() == snap


def test_the_counted_claim_is_adopted_when_the_holder_goes():
    live, p1, a, b, truth = contended(1, 5)
    assert owner_of(live.snapshot(), p1.devices[0]) == "r-a"
    live.delete_object(a)
    snap = live.snapshot()
    assert owner_of(snap, p1.devices[0]) == "r-b"
    assert snap["nodes"]["n1"]["unknown_gpus"] == 0
    assert Ledger.rebuild([b, truth], config()).snapshot() == snap


def test_two_ids_on_one_device_without_truth_go_to_the_earlier_claim_in_any_order():
    """No kubelet truth on the node (every claim takes the first-holder shortcut of `Claims.put`): two
    validly signed placements of different ids naming one device still end as `contend` orders them."""
    early = Placement("r-early", "n1", devices=(0,))
    late = Placement("r-late", "n1", devices=(0,))
    pods = [
        stored_pod(name, "team", p, encode_placement(p, KEY, Binding("team", name)), created, f"u-{name}")
        for name, p, created in (("early", early, 1), ("late", late, 2))
    ]
    snaps = []
    for order in itertools.permutations(pods):
        led = Ledger.rebuild([node("n1", gpus=4), *order], config())
        assert led.reservations()["r-early"].placement.devices == (0,)
        assert "r-late" not in led.reservations()  # counted as a GPU of unknown identity instead
        snaps.append(led.snapshot())
    assert snaps[0] == snaps[1]
