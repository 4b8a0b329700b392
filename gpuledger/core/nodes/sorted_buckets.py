"""Keyed sorted buckets that stay cheap at 65,000 nodes: a bucket is a plain list while it is short and a
`SortedNames` (gpuledger.core.nodes.sorted_names: sorted chunks) once it is long.

A sorted insert or delete in a list moves every entry after it. Near the front of a 65,000-node bucket (the
free nodes of a large cluster, in name order: where best fit, the bucket walks and spreading take nodes from)
a delete and an insert cost 30-40 us; in chunks of at most 1,024 entries they move one chunk. Below a few
thousand entries the one list is faster, and that is every bucket of a cluster of a few thousand nodes.
Readers see a sorted sequence either way: iteration, `len`, `[0]`.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Any, TypeAlias, TypeVar

from gpuledger.core.nodes.sorted_names import SortedNames

K = TypeVar("K")
T = TypeVar("T", bound=Any)

LONG = 4096  # a list longer than this becomes a SortedNames...
SHORT = 1024  # ...and a SortedNames shorter than this a list again

Bucket: TypeAlias = "list[T] | SortedNames[T]"


def add(buckets: dict[K, Bucket[T]], key: K, item: T, long: int | None = None) -> None:
    """File `item` in its place in `buckets[key]` (made when missing); a list past `long` entries becomes a
    SortedNames (None: LONG, read at the call, so tests can shrink it)."""
    bucket = buckets.get(key)
    if bucket is None:
        buckets[key] = [item]
    elif isinstance(bucket, list):
        insort(bucket, item)
        if len(bucket) > (LONG if long is None else long):
            buckets[key] = SortedNames(bucket)
    else:
        bucket.add(item)


def discard(buckets: dict[K, Bucket[T]], key: K, item: T, short: int | None = None) -> None:
    """Take `item` out of `buckets[key]` where it is there; a SortedNames below `short` entries becomes a list
    again (0: never; None: SHORT). An emptied bucket stays: callers that drop empty keys do so themselves."""
    bucket = buckets.get(key)
    if not bucket:
        return
    if isinstance(bucket, list):
        i = bisect_left(bucket, item)
        if i < len(bucket) and bucket[i] == item:
            del bucket[i]
        return
    bucket.discard(item)
    if len(bucket) < (SHORT if short is None else short):
        buckets[key] = list(bucket)


def settle(buckets: dict[K, list[T]], long: int | None = None) -> dict[K, Bucket[T]]:
    """Buckets built as sorted lists, those past `long` entries (None: LONG) made SortedNames."""
    limit = LONG if long is None else long
    out: dict[K, Bucket[T]] = dict(buckets)
    for key, bucket in buckets.items():
        if len(bucket) > limit:
            out[key] = SortedNames(bucket)
    return out
