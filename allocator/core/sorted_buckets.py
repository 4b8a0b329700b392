"""Keyed sorted buckets that stay cheap at 65,000 nodes: a bucket is a plain list while it is short and a
`LongBucket`, a list of sorted chunks, once it is long.

A sorted insert or delete in a list moves every entry after it. Near the front of a 65,000-node bucket (the
free nodes of a large cluster, in name order: where best fit, the bucket walks and spreading take nodes from)
a delete and an insert cost 30-40 us; in chunks of at most 2,000 entries they move one chunk. Below a few
thousand entries the one list is faster, and that is every bucket of a cluster of a few thousand nodes.
Readers see a sorted sequence either way: iteration, `len`, `[0]`. (sortedcontainers' SortedList is the same
idea, with more; the core imports only the standard library.)
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator
from itertools import chain
from typing import Any, Generic, TypeAlias, TypeVar

K = TypeVar("K")
T = TypeVar("T", bound=Any)

LONG = 4096  # a list longer than this becomes a LongBucket...
SHORT = 1024  # ...and a LongBucket shorter than this a list again
CHUNK = 1000  # a LongBucket's chunks hold up to 2 * CHUNK entries; one under CHUNK // 4 joins a neighbour


class LongBucket(Generic[T]):
    """A sorted sequence of unique entries kept as sorted chunks, with each chunk's last entry in `_lasts`."""

    __slots__ = ("_chunks", "_lasts", "_len")
    __hash__ = None  # type: ignore[assignment]  # (mutable)

    def __init__(self, ordered: Iterable[T] = ()) -> None:
        items = list(ordered)  # already sorted
        self._chunks: list[list[T]] = [items[i : i + CHUNK] for i in range(0, len(items), CHUNK)]
        self._lasts: list[T] = [c[-1] for c in self._chunks]
        self._len = len(items)

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[T]:
        return chain.from_iterable(self._chunks)

    def __getitem__(self, index: int) -> T:
        if index < 0:
            index += self._len
        if 0 <= index < self._len:
            for chunk in self._chunks:
                if index < len(chunk):
                    return chunk[index]
                index -= len(chunk)
        raise IndexError("LongBucket index out of range")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, LongBucket | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __repr__(self) -> str:
        return f"LongBucket({list(self)!r})"

    def add(self, item: T) -> None:
        chunks, lasts = self._chunks, self._lasts
        self._len += 1
        if not chunks:
            chunks.append([item])
            lasts.append(item)
            return
        i = bisect_left(lasts, item)
        if i == len(lasts):  # after every entry: the end of the last chunk
            i -= 1
            chunks[i].append(item)
            lasts[i] = item
        else:
            insort(chunks[i], item)
        if len(chunks[i]) > 2 * CHUNK:
            self._split(i)

    def discard(self, item: T) -> None:
        chunks, lasts = self._chunks, self._lasts
        i = bisect_left(lasts, item)
        if i == len(lasts):
            return
        chunk = chunks[i]
        j = bisect_left(chunk, item)
        if chunk[j] != item:  # (j is in range: chunk[-1] >= item)
            return
        del chunk[j]
        self._len -= 1
        if not chunk:
            del chunks[i], lasts[i]
            return
        if j == len(chunk):
            lasts[i] = chunk[-1]
        if len(chunk) < CHUNK // 4 and len(chunks) > 1:  # join a neighbour: chunks never dwindle to many tiny
            k = i if i + 1 < len(chunks) else i - 1
            chunks[k].extend(chunks[k + 1])
            lasts[k] = lasts[k + 1]
            del chunks[k + 1], lasts[k + 1]
            if len(chunks[k]) > 2 * CHUNK:
                self._split(k)

    def _split(self, i: int) -> None:
        chunk = self._chunks[i]
        self._chunks.insert(i + 1, chunk[CHUNK:])
        del chunk[CHUNK:]
        self._lasts.insert(i, chunk[-1])


Bucket: TypeAlias = "list[T] | LongBucket[T]"


def add(buckets: dict[K, Bucket[T]], key: K, item: T) -> None:
    """File `item` in its place in `buckets[key]` (made when missing)."""
    bucket = buckets.get(key)
    if bucket is None:
        buckets[key] = [item]
    elif isinstance(bucket, list):
        insort(bucket, item)
        if len(bucket) > LONG:
            buckets[key] = LongBucket(bucket)
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
    """Buckets built as sorted lists, the long ones made LongBuckets."""
    out: dict[K, Bucket[T]] = dict(buckets)
    for key, bucket in buckets.items():
        if len(bucket) > LONG:
            out[key] = LongBucket(bucket)
    return out
