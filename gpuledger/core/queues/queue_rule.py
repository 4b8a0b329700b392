"""The queue's rule: priority, then arrival, with a bounded backfill window. Pure.

One rule for everything that waits for GPUs: the ledger's waiting pods (gpuledger.core.queues.waiting, which
walks it pod shape by pod shape) and the GPUWorkload controller's queue (`plan`, over a whole list). Time is
an argument; nothing here reads a clock, asks the ledger or talks to the API.

1. Order: higher priority first; equal priority, earlier arrival first; then the key, for a total order.
2. Walk that order and start the first entry that fits whole.
3. An entry that does not fit is passed over (backfill: a smaller one behind it may start) only while it has
   waited less than `backfill_window_s`. Once it has waited that long it becomes a barrier: nothing behind it
   starts until it has started, so every GPU freed from then on goes to it or to entries ahead of it. Its wait
   is bounded by the window plus the time the entries ahead of it need to free enough GPUs.
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

K = TypeVar("K", bound=Hashable)

DEFAULT_BACKFILL_WINDOW_S = 300.0


def order_key(priority: int, arrival: float, key: object) -> tuple[int, float, str]:
    """Where an entry stands in line: smaller goes first (rule 1)."""
    return (-priority, arrival, str(key))


def is_barrier(arrival: float, now: float, backfill_window_s: float) -> bool:
    """Whether an entry that does not fit has waited long enough to stop everything behind it (rule 3)."""
    return now - arrival >= backfill_window_s


@dataclass(frozen=True)
class Entry(Generic[K]):
    key: K
    priority: int
    queued_at: float  # epoch seconds: the entry's arrival in the queue
    gpus: int = 0  # total, for the record (the ledger decides what fits)


@dataclass(frozen=True)
class Verdict:
    """The ledger's answer for one entry: fits whole now, or not and why (the blocking resource)."""

    fits: bool
    reason: str = ""
    message: str = ""


@dataclass(frozen=True)
class Plan(Generic[K]):
    """One pass: what to start (or None), each queued key's 1-based position, and why each one waits."""

    start: K | None
    positions: Mapping[K, int]
    waiting: Mapping[K, Verdict]
    barrier: K | None = None


def order(entries: Sequence[Entry[K]]) -> list[Entry[K]]:
    return sorted(entries, key=lambda e: order_key(e.priority, e.queued_at, e.key))


def plan(
    entries: Sequence[Entry[K]],
    verdicts: Mapping[K, Verdict],
    now: float,
    backfill_window_s: float = DEFAULT_BACKFILL_WINDOW_S,
) -> Plan[K]:
    """Apply the rule above. `verdicts` holds an answer per entry (a missing one counts as not fitting)."""
    ordered = order(entries)
    positions = {e.key: i + 1 for i, e in enumerate(ordered)}
    waiting: dict[K, Verdict] = {}
    start: K | None = None
    barrier: Entry[K] | None = None
    for entry in ordered:
        verdict = verdicts.get(entry.key, Verdict(False, "Unknown", "no answer from the ledger"))
        if start is None and barrier is None and verdict.fits:
            start = entry.key
            continue
        if barrier is not None:
            waiting[entry.key] = Verdict(
                False,
                "BehindBarrier",
                f"waiting behind {barrier.key} (priority {barrier.priority}), which has "
                f"waited past the {backfill_window_s:g}s backfill window"
                + (f"; {verdict.message}" if not verdict.fits and verdict.message else ""),
            )
            continue
        if verdict.fits:  # fits, but one entry starts per pass: it goes next
            waiting[entry.key] = Verdict(
                False, "Next", "fits; starts after the workload ahead of it is placed"
            )
            continue
        waiting[entry.key] = verdict
        if start is None and is_barrier(entry.queued_at, now, backfill_window_s):
            barrier = entry
    return Plan(start, positions, waiting, barrier.key if barrier else None)
