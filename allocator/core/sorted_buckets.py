"""Keyed sorted buckets that stay cheap at 65,000 nodes: a bucket is a plain list while it is short and a
`SortedList` (sortedcontainers) once it is long.

A sorted insert or delete in a list moves every entry after it. Near the front of a 65,000-node bucket (the
free nodes of a large cluster, in name order: where best fit and the bucket walks take nodes from) an insert
and a delete cost ~32 us, against ~3 us in a SortedList. Below a few thousand entries the list is faster (0.8
against 2.1 us at 100 entries), and that is every bucket of a cluster of a few thousand nodes. Readers see a
sorted sequence either way: iteration, `len`, `[0]`.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from typing import Any, TypeAlias, TypeVar

from sortedcontainers import SortedList

K = TypeVar("K")
T = TypeVar("T", bound=Any)

Bucket: TypeAlias = "list[T] | SortedList[T]"

LONG = 4096  # a list longer than this becomes a SortedList (the two cost the same at ~5,000 entries)...
SHORT = 1024  # ...and a SortedList shorter than this a list again


def add(buckets: dict[K, Bucket[T]], key: K, item: T) -> None:
    """File `item` in its place in `buckets[key]` (made when missing)."""
    bucket = buckets.get(key)
    if bucket is None:
        buckets[key] = [item]
    elif isinstance(bucket, list):
        insort(bucket, item)
        if len(bucket) > LONG:
            buckets[key] = SortedList(bucket)
    else:
        bucket.add(item)


def discard(buckets: dict[K, Bucket[T]], key: K, item: T) -> None:
    """Take `item` out of `buckets[key]` where it is there."""
    bucket = buckets.get(key)
    if not bucket:
        return
    if isinstance(bucket, list):
        i = bisect_left(bucket, item)
        if i < len(bucket) and bucket[i] == item:
            del bucket[i]
        return
    bucket.discard(item)
    if len(bucket) < SHORT:
        buckets[key] = list(bucket)


def settle(buckets: dict[K, list[T]]) -> dict[K, Bucket[T]]:
    """Buckets built as sorted lists, the long ones made SortedLists."""
    out: dict[K, Bucket[T]] = dict(buckets)
    for key, bucket in buckets.items():
        if len(bucket) > LONG:
            out[key] = SortedList(bucket)
    return out
