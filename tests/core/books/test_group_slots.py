"""A gang's slot and claim tables answer what a scan of a plain dict answers, after any sequence of writes."""

from __future__ import annotations

import pickle
import random

import pytest

from gpuledger.core.books.books import GroupState
from gpuledger.core.books.group_slots import ClaimTable, SlotTable
from gpuledger.core.model import GroupSlot


def _slot(n: int, node: str = "n") -> GroupSlot:
    return GroupSlot(n, f"{node}-{n}", (n % 8,), (), ())


def _check_claims(table: ClaimTable, plain: dict) -> None:
    assert dict(table) == plain
    free = sorted(s for s, who in plain.items() if who is None)
    assert table.first_unclaimed() == (free[0] if free else None)
    assert table.claimed() == sum(1 for who in plain.values() if who is not None)
    assert table.unclaimed() == len(free)


def _check_slots(table: SlotTable, plain: dict) -> None:
    assert dict(table) == plain
    assert table.plan() == tuple(plain[s] for s in sorted(plain))
    if plain:
        assert table.first() == plain[min(plain)]


@pytest.mark.parametrize("seed", range(20))
def test_claim_table_matches_a_scan(seed: int) -> None:
    rnd = random.Random(seed)
    plain: dict[int, str | None] = dict.fromkeys(range(rnd.randrange(1, 40)))
    table = ClaimTable(plain)
    _check_claims(table, plain)
    for step in range(400):
        op, slot = rnd.randrange(8), rnd.randrange(60)
        if op <= 2:
            table[slot] = plain[slot] = f"pod-{step}"
        elif op <= 4:
            table[slot] = plain[slot] = None
        elif op == 5:
            assert table.pop(slot, "gone") == plain.pop(slot, "gone")
        elif op == 6 and slot in plain:
            del table[slot]
            del plain[slot]
        elif op == 7:
            assert table.setdefault(slot, None) == plain.setdefault(slot, None)
        _check_claims(table, plain)
    table.update({1: None, 2: "x"})
    plain.update({1: None, 2: "x"})
    _check_claims(table, plain)
    if table:
        assert table.popitem() == plain.popitem()
        _check_claims(table, plain)
    copy = pickle.loads(pickle.dumps(table))
    assert type(copy) is ClaimTable
    _check_claims(copy, plain)
    table.clear()
    _check_claims(table, {})


@pytest.mark.parametrize("seed", range(10))
def test_slot_table_plan_follows_every_write(seed: int) -> None:
    rnd = random.Random(seed)
    plain = {s: _slot(s) for s in rnd.sample(range(50), 10)}
    table = SlotTable(plain)
    _check_slots(table, plain)
    for step in range(200):
        op, slot = rnd.randrange(4), rnd.randrange(50)
        if op <= 1:
            table[slot] = plain[slot] = _slot(slot, f"step{step}")  # a new slot, or one placed anew
        elif op == 2:
            assert table.pop(slot, None) == plain.pop(slot, None)
        elif op == 3 and slot in plain:
            del table[slot]
            del plain[slot]
        _check_slots(table, plain)
    copy = pickle.loads(pickle.dumps(table))
    assert type(copy) is SlotTable
    _check_slots(copy, plain)


def test_group_state_keeps_its_tables_from_plain_dicts() -> None:
    group = GroupState(
        key="job/ns/g", slots={1: _slot(1), 0: _slot(0)}, claims={0: "p0", 1: None}, deadline=9.0
    )
    assert type(group.slots) is SlotTable and type(group.claims) is ClaimTable
    assert group.plan() == (_slot(0), _slot(1))
    assert group.claims.first_unclaimed() == 1  # type: ignore[attr-defined]
    group.slots[2] = _slot(2)
    assert [s.slot for s in group.plan()] == [0, 1, 2]


def test_a_large_gangs_unclaimed_slots_go_with_its_last_pod() -> None:
    """1,200 slots, two pods: when the last pod ends, every unclaimed slot goes, in one sweep (each slot's
    own release used to sweep again, one call deeper per slot, past Python's recursion limit)."""
    from gpuledger.core.ledger import Ledger, LedgerConfig
    from gpuledger.core.model import Placement
    from gpuledger.core.pods.request import request_from_pod
    from tests.core.books.test_gang_claims_differential import _nodes, _owner, _pod

    nodes = _nodes(160)
    led = Ledger.rebuild(nodes, LedgerConfig(placement_key=b"k"), now=0.0)
    empty = led.snapshot()
    job = _owner("big", 1200, {"topology.scheduler/gang": "true"})
    for i in range(2):
        req = request_from_pod(_pod(f"big-{i}", 1), job, reservation_id=f"r-big-{i}", namespace="gang")
        assert req is not None
        placed = led.reserve_or_wait(req, 0.0, True)
        assert isinstance(placed, Placement) and len(placed.group_plan) == 1200
    assert led.release("r-big-0")  # another pod lives: its slot is held again for the gang
    assert led.groups()["job/gang/big"].claims.unclaimed() == 1199  # type: ignore[attr-defined]
    assert led.release("r-big-1")  # the last pod: the gang and every slot go
    assert led.groups() == {} and led.reservations() == {}
    assert led.snapshot() == empty
