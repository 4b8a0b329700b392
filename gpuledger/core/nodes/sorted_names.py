"""A name-sorted list kept in chunks, so adding or removing a name moves at most one chunk: a node class (or
any group of nodes) can hold all 65,000 nodes of a cluster and still change in O(log n) per node, where a
plain sorted list moves half of itself on every insert or delete. The entries may be any distinct values that
sort (the index's best-fit buckets hold (fit key, name) pairs: gpuledger.core.nodes.sorted_buckets).
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator
from itertools import chain
from typing import Any, Generic, TypeVar

T = TypeVar("T", bound=Any)

CHUNK = 512  # a chunk splits in two above 2 * CHUNK names


class SortedNames(Generic[T]):
    """Distinct names in sorted order: `add`, `remove`, `discard`, `[i]`, `len`, iteration (in order)."""

    __slots__ = ("_chunks", "_maxes", "_len")
    __hash__ = None  # type: ignore[assignment]  # (mutable)

    def __init__(self, names: Iterable[T] = ()) -> None:
        """`names`, already sorted and distinct."""
        items = list(names)
        self._chunks = [items[i : i + CHUNK] for i in range(0, len(items), CHUNK)]
        self._maxes = [c[-1] for c in self._chunks]  # the last name of each chunk
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
        raise IndexError("SortedNames index out of range")

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SortedNames | list | tuple):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))
        return NotImplemented

    def __repr__(self) -> str:
        return f"SortedNames({list(self)!r})"

    def add(self, name: T) -> None:
        """Add a name not present."""
        maxes, chunks = self._maxes, self._chunks
        self._len += 1
        if not maxes:
            chunks.append([name])
            maxes.append(name)
            return
        i = bisect_left(maxes, name)
        if i == len(maxes):  # past the last name: appended to the last chunk
            i -= 1
            chunk = chunks[i]
            chunk.append(name)
            maxes[i] = name
        else:
            chunk = chunks[i]
            insort(chunk, name)
        if len(chunk) > 2 * CHUNK:
            half = chunk[CHUNK:]
            del chunk[CHUNK:]
            chunks.insert(i + 1, half)
            maxes.insert(i, chunk[-1])

    def remove(self, name: T) -> None:
        """Remove a name present."""
        if not self.discard(name):
            raise KeyError(name)

    def discard(self, name: T) -> bool:
        """Remove a name if present; whether it was."""
        maxes, chunks = self._maxes, self._chunks
        i = bisect_left(maxes, name)
        if i == len(maxes):
            return False
        chunk = chunks[i]
        j = bisect_left(chunk, name)
        if chunk[j] != name:  # (j is in range: the chunk's last name is not below `name`)
            return False
        del chunk[j]
        self._len -= 1
        if not chunk:
            del chunks[i], maxes[i]
        elif j == len(chunk):
            maxes[i] = chunk[-1]
        return True
