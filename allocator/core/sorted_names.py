"""A name-sorted list kept in chunks, so adding or removing a name moves at most one chunk: a node class (or
any group of nodes) can hold all 65,000 nodes of a cluster and still change in O(log n) per node, where a
plain sorted list moves half of itself on every insert or delete.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Iterable, Iterator
from itertools import chain

CHUNK = 512  # a chunk splits in two above 2 * CHUNK names


class SortedNames:
    """Distinct names in sorted order: `add`, `remove`, `first`, `len`, iteration (in order)."""

    __slots__ = ("_chunks", "_maxes", "_len")

    def __init__(self, names: Iterable[str] = ()) -> None:
        """`names`, already sorted and distinct."""
        items = list(names)
        self._chunks = [items[i : i + CHUNK] for i in range(0, len(items), CHUNK)]
        self._maxes = [c[-1] for c in self._chunks]  # the last name of each chunk
        self._len = len(items)

    @classmethod
    def of(cls, name: str) -> SortedNames:
        """A list of one name (what most node classes are, on a cluster of varied pods), made cheaply."""
        out = cls.__new__(cls)
        out._chunks = [[name]]
        out._maxes = [name]
        out._len = 1
        return out

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[str]:
        return chain.from_iterable(self._chunks)

    def first(self) -> str:
        return self._chunks[0][0]

    def add(self, name: str) -> None:
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

    def remove(self, name: str) -> None:
        """Remove a name present."""
        maxes, chunks = self._maxes, self._chunks
        i = bisect_left(maxes, name)
        chunk = chunks[i]
        j = bisect_left(chunk, name)
        if j == len(chunk) or chunk[j] != name:
            raise KeyError(name)
        del chunk[j]
        self._len -= 1
        if not chunk:
            del chunks[i], maxes[i]
        elif j == len(chunk):
            maxes[i] = chunk[-1]
