"""SortedNames (the chunked name-sorted list node classes keep their members in) equals a sorted set under any
sequence of adds and removes, with chunks split and dropped as they fill and empty."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

import gpuledger.core.nodes.sorted_names as sorted_names
from gpuledger.core.nodes.sorted_names import SortedNames

names = st.integers(0, 60).map(lambda i: f"n{i:02d}")


@given(st.sets(names, max_size=20), st.lists(names, max_size=200), st.sampled_from([1, 2, 3, 512]))
def test_sorted_names_equal_a_sorted_set(initial, toggles, chunk):
    saved = sorted_names.CHUNK
    sorted_names.CHUNK = chunk  # small chunks: splits and empty chunks happen within a few names
    try:
        s = SortedNames(sorted(initial))
        ref = set(initial)
        for name in toggles:
            if name in ref:
                s.remove(name)
                ref.discard(name)
            else:
                s.add(name)
                ref.add(name)
            assert list(s) == sorted(ref)
            assert len(s) == len(ref)
            if ref:
                assert s[0] == min(ref)
            assert all(0 < len(c) <= 2 * chunk for c in s._chunks)
            assert s._maxes == [c[-1] for c in s._chunks]
    finally:
        sorted_names.CHUNK = saved


def test_one_name_and_a_missing_name():
    s = SortedNames(["b"])
    assert list(s) == ["b"] and len(s) == 1 and s[0] == "b"
    try:
        s.remove("a")
    except KeyError:
        pass
    else:
        raise AssertionError("removing a missing name must raise")
    s.remove("b")
    assert list(s) == [] and len(s) == 0
