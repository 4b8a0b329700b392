"""The queue's rule: priority then age, bounded backfill; backoff on the documented schedule. No clock."""

from __future__ import annotations

import pytest

from gpuledger.controller import backoff
from gpuledger.controller.queue import Entry, Verdict, order, plan

FITS, NO = Verdict(True), Verdict(False, "NotEnoughGpus", "not enough GPUs on 16 nodes")


def test_order_is_priority_then_age_then_key():
    entries = [Entry("c", 0, 30.0), Entry("a", 5, 50.0), Entry("b", 5, 10.0), Entry("d", 0, 30.0)]
    assert [e.key for e in order(entries)] == ["b", "a", "c", "d"]


def test_first_that_fits_starts_and_positions_are_one_based():
    entries = [Entry("hi", 10, 0.0), Entry("lo", 0, 0.0)]
    p = plan(entries, {"hi": FITS, "lo": FITS}, now=1.0)
    assert p.start == "hi" and p.positions == {"hi": 1, "lo": 2}
    assert p.waiting["lo"].reason == "Next"


def test_small_passes_a_large_blocked_one_inside_the_window():
    entries = [Entry("large", 10, 100.0, gpus=64), Entry("small", 0, 150.0, gpus=1)]
    p = plan(entries, {"large": NO, "small": FITS}, now=200.0, backfill_window_s=300)
    assert p.start == "small" and p.barrier is None
    assert p.waiting["large"] == NO


def test_past_the_window_the_blocked_one_becomes_a_barrier():
    entries = [Entry("large", 10, 100.0, gpus=64), Entry("small", 0, 150.0, gpus=1)]
    p = plan(entries, {"large": NO, "small": FITS}, now=400.0, backfill_window_s=300)
    assert p.start is None and p.barrier == "large"
    assert p.waiting["small"].reason == "BehindBarrier" and "large" in p.waiting["small"].message


def test_higher_priority_newcomer_goes_ahead_of_a_barrier():
    entries = [Entry("old", 0, 0.0), Entry("urgent", 100, 1000.0)]
    p = plan(entries, {"old": NO, "urgent": FITS}, now=1000.0, backfill_window_s=300)
    assert p.start == "urgent"


def test_nothing_fits_nothing_starts():
    p = plan([Entry("a", 0, 0.0), Entry("b", 0, 1.0)], {"a": NO, "b": NO}, now=2.0)
    assert p.start is None and set(p.waiting) == {"a", "b"}


def test_wait_is_bounded_by_the_window():
    """A large workload that never fits on its own: small ones pass it until the window ends, never after."""
    started, now = [], 0.0
    large = Entry("large", 0, 0.0, gpus=64)
    while now < 1000.0:
        small = Entry(f"s{now:g}", 0, now, gpus=1)
        p = plan([large, small], {"large": NO, small.key: FITS}, now=now, backfill_window_s=300)
        if p.start:
            started.append(now)
        now += 50.0
    assert started and max(started) < 300.0


def test_backoff_schedule_defaults():
    assert [backoff.nominal_delay(n) for n in (1, 2, 3, 4, 5, 6, 7)] == [10, 20, 40, 80, 160, 300, 300]
    assert backoff.retry_delay(1, 0.0) == 5.0 and backoff.retry_delay(1, 0.999999) == pytest.approx(
        10.0, abs=1e-4
    )
    assert backoff.retry_delay(3, 0.5) == 30.0
    assert backoff.next_retry_time(1000.0, 2, 0.0, base_s=30, cap_s=60) == 1030.0
    assert backoff.retry_delay(10, 0.0, base_s=30, cap_s=60) == 30.0


@pytest.mark.parametrize("retry,draw", [(0, 0.5), (1, 1.0), (1, -0.1)])
def test_backoff_refuses_bad_inputs(retry, draw):
    with pytest.raises(ValueError):
        backoff.retry_delay(retry, draw)
