"""Buckets that turn from lists into SortedNames once long (gpuledger.core.nodes.sorted_buckets) hold exactly
what a sorted list would, and a ledger whose buckets cross the thresholds decides exactly what one whose
buckets stay lists decides. The thresholds and the chunk size are lowered here so that a handful of entries
crosses them: lists into SortedNames and back, chunks split and emptied."""

from __future__ import annotations

import contextlib
import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuledger.core.nodes import sorted_buckets, sorted_names
from gpuledger.core.nodes.sorted_names import SortedNames
from tests.core.test_properties import node_spec, op, run


@contextlib.contextmanager
def thresholds(long: int, short: int, chunk: int):
    saved = sorted_buckets.LONG, sorted_buckets.SHORT, sorted_names.CHUNK
    sorted_buckets.LONG, sorted_buckets.SHORT, sorted_names.CHUNK = long, short, chunk
    try:
        yield
    finally:
        sorted_buckets.LONG, sorted_buckets.SHORT, sorted_names.CHUNK = saved


@pytest.mark.parametrize("seed", range(5))
def test_buckets_hold_what_sorted_lists_hold_across_both_forms(seed):
    rng = random.Random(seed)
    buckets: dict[int, sorted_buckets.Bucket[str]] = {}
    expected: dict[int, list[str]] = {}
    forms = set()
    with thresholds(8, 3, chunk=8):
        for _ in range(4000):
            key, name = rng.randrange(3), f"n{rng.randrange(60):02d}"
            if rng.random() < 0.55 and name not in expected.get(key, []):
                sorted_buckets.add(buckets, key, name)
                expected.setdefault(key, []).append(name)
                expected[key].sort()
            else:
                sorted_buckets.discard(buckets, key, name)  # (often absent: that must change nothing)
                if name in expected.get(key, []):
                    expected[key].remove(name)
            forms |= {type(b) for b in buckets.values()}
            assert {k: list(b) for k, b in buckets.items() if b} == {k: v for k, v in expected.items() if v}
            for key, b in buckets.items():
                assert (len(b) <= 8) if isinstance(b, list) else (len(b) >= 3)
                if isinstance(b, SortedNames):
                    check_chunks(b)
                    want = expected[key]
                    assert [b[i] for i in range(len(b))] == want and b[-1] == want[-1] and b == want
                    with pytest.raises(IndexError):
                        b[len(b)]
    assert forms == {list, SortedNames}


def check_chunks(b: SortedNames) -> None:
    chunks, lasts = b._chunks, b._maxes
    assert all(chunks) and [c[-1] for c in chunks] == lasts and len(b) == sum(map(len, chunks))
    assert all(len(c) <= 2 * sorted_names.CHUNK for c in chunks)
    flat = [x for c in chunks for x in c]
    assert flat == sorted(set(flat))


def test_settled_buckets_are_sorted_lists_only_when_long():
    with thresholds(4, 2, chunk=2):
        out = sorted_buckets.settle({1: ["a", "b"], 2: ["a", "b", "c", "d", "e"]})
    assert type(out[1]) is list and type(out[2]) is SortedNames and list(out[2]) == ["a", "b", "c", "d", "e"]


def test_a_caller_s_own_thresholds_win_over_the_module_s():
    """What node classes ask (node_classes.py): chunked past their own limit, and never back to a list."""
    buckets: dict[int, sorted_buckets.Bucket[str]] = {}
    with thresholds(1000, 500, chunk=2):
        for name in "abcde":
            sorted_buckets.add(buckets, 0, name, long=3)
        assert type(buckets[0]) is SortedNames
        for name in "abcd":
            sorted_buckets.discard(buckets, 0, name, short=0)
        assert type(buckets[0]) is SortedNames and list(buckets[0]) == ["e"]
        sorted_buckets.discard(buckets, 0, "e", short=0)
        assert type(buckets[0]) is SortedNames and not buckets[0]
        assert type(sorted_buckets.settle({1: list("abcd")}, long=3)[1]) is SortedNames


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(node_spec, min_size=3, max_size=8), st.lists(op, min_size=10, max_size=60))
def test_a_ledger_with_sorted_list_buckets_keeps_every_invariant_and_answer(node_specs, ops):
    """test_properties' random streams (every invariant, the index against a full scan, rebuild against the
    live ledger) with buckets of 2 or more entries as SortedNames, and the same answers as with lists only."""
    with thresholds(1, 1, chunk=2):
        answers = run(node_specs, ops)
    assert answers == run(node_specs, ops)
