"""A PodGroup's pods beyond its `minCount`: kube-scheduler schedules them one by one once the gang is placed,
so the ledger gives each a new slot near the gang instead of holding it for a slot to free (which a Job of 8
with `minCount` 6 would wait for forever). Any other gang stays as big as its owner says. A rebuild from the
stored pods holds what the live ledger holds."""

from __future__ import annotations

import json

from gpuledger.core.ledger import Ledger, LedgerConfig
from gpuledger.core.model import Denial, GroupSpec, Placement, Request
from tests.core.core_factory import node, pod

KEY = b"pod-group-key"


def cluster() -> list[dict]:
    return [node(f"l{leaf}-n{i}", 8, leaf=f"leaf-{leaf}") for leaf in range(2) for i in range(2)]


def ledger() -> Ledger:
    led = Ledger(LedgerConfig(placement_key=KEY, reservation_ttl_s=30.0, default_strategy="best_fit"))
    for obj in cluster():
        led.apply_object(obj, 0.0)
    return led


def member(key: str, size: int, i: int) -> Request:
    return Request(id=f"{key}-{i}", gpus=4, group=GroupSpec(key=key, size=size), namespace="ml", name=f"p{i}")


def test_pods_beyond_min_count_get_slots_near_the_placed_gang():
    led = ledger()
    key = "podgroup/ml/pg"
    placed = [led.reserve(member(key, 2, i), 0.0) for i in range(4)]
    assert all(isinstance(p, Placement) for p in placed), placed
    assert [p.slot for p in placed] == [0, 1, 2, 3]
    leaf_of = {n["metadata"]["name"]: n["metadata"]["labels"]["topology.scheduler/leaf"] for n in cluster()}
    assert len({leaf_of[p.node] for p in placed}) == 1  # the extra pods fill the gang's leaf first
    stored = [pod(f"p{i}", namespace="ml", placement=p, key=KEY, gpus=4) for i, p in enumerate(placed)]
    for obj in stored:
        led.apply_object(obj, 1.0)
    rebuilt = Ledger.rebuild([*cluster(), *stored], led.config, 1.0)
    assert json.dumps(rebuilt.snapshot(), sort_keys=True, default=str) == json.dumps(
        led.snapshot(), sort_keys=True, default=str
    )
    # four more fill the other leaf, no device twice; then the members hold every GPU and a ninth is told so
    more = [led.reserve(member(key, 2, i), 1.0) for i in range(4, 8)]
    assert all(isinstance(p, Placement) for p in more) and {leaf_of[p.node] for p in more} == {"leaf-1"}
    held = [(p.node, d) for p in [*placed, *more] for d in p.devices]
    assert len(held) == len(set(held)) == 32
    ninth = led.reserve(member(key, 2, 8), 1.0)
    assert isinstance(ninth, Denial) and "no node for a new pod of group podgroup/ml/pg" in ninth.message


def test_any_other_gang_keeps_its_size():
    led = ledger()
    key = "job/ml/train"
    placed = [led.reserve(member(key, 2, i), 0.0) for i in range(2)]
    assert all(isinstance(p, Placement) for p in placed)
    third = led.reserve(member(key, 2, 2), 0.0)
    assert isinstance(third, Denial) and "already has 2 pod(s) placed in 2 slot(s)" in third.message
