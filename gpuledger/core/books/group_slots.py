"""A gang's two tables, each keeping what every pod's admission asks of it instead of recomputing it per pod:
its plan (the slots in slot order, carried by every placement of the gang) and its smallest unclaimed slot
and count of claimed ones. Recomputed per pod, both cost the gang's size, so admitting a whole gang cost
its size squared.

Both are dicts, so every owner that writes a slot or a claim (the gang's plan and claims, the leases'
release, the rebuild's adoption) writes them as before; each write keeps the table's summary current.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping

from gpuledger.core.model import GroupSlot

_MISSING = object()


class SlotTable(dict[int, GroupSlot]):
    """slot -> GroupSlot; `plan()` is built once and kept until a slot is written or removed."""

    __slots__ = ("_plan",)

    def __init__(self, slots: Mapping[int, GroupSlot] | Iterable[tuple[int, GroupSlot]] = ()) -> None:
        super().__init__(slots)
        self._plan: tuple[GroupSlot, ...] | None = None

    def plan(self) -> tuple[GroupSlot, ...]:
        """Every slot, in slot order."""
        plan = self._plan
        if plan is None:
            plan = self._plan = tuple(self[s] for s in sorted(self))
        return plan

    def first(self) -> GroupSlot:
        """The lowest-numbered slot (the table is not empty)."""
        return self.plan()[0]

    def __setitem__(self, slot: int, value: GroupSlot) -> None:
        self._plan = None
        super().__setitem__(slot, value)

    def __delitem__(self, slot: int) -> None:
        self._plan = None
        super().__delitem__(slot)

    def pop(self, slot, *default):
        self._plan = None
        return super().pop(slot, *default)

    def popitem(self):
        self._plan = None
        return super().popitem()

    def clear(self) -> None:
        self._plan = None
        super().clear()

    def setdefault(self, slot, default=None):
        self._plan = None
        return super().setdefault(slot, default)

    def update(self, *args, **kwargs) -> None:
        self._plan = None
        super().update(*args, **kwargs)

    def __reduce__(self):
        return (SlotTable, (dict(self),))


class ClaimTable(dict[int, str | None]):
    """slot -> the id of the pod that claimed it (None: unclaimed, held for the gang); keeps the unclaimed
    slots (with a lazy min-heap for the smallest) and the count of claimed ones."""

    __slots__ = ("_claimed", "_free", "_heap")

    def __init__(self, claims: Mapping[int, str | None] | Iterable[tuple[int, str | None]] = ()) -> None:
        super().__init__()
        self._free: set[int] = set()
        self._heap: list[int] = []
        self._claimed = 0
        for slot, who in dict(claims).items():
            self[slot] = who

    def first_unclaimed(self) -> int | None:
        """The smallest unclaimed slot; None when every slot is claimed."""
        heap, free = self._heap, self._free
        while heap and heap[0] not in free:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def claimed(self) -> int:
        """How many slots a pod holds."""
        return self._claimed

    def unclaimed(self) -> int:
        return len(self._free)

    def _forget(self, slot: int) -> None:
        """`slot`'s entry leaves the summary (before it is overwritten or removed)."""
        old = dict.get(self, slot, _MISSING)
        if old is None:
            self._free.discard(slot)
        elif old is not _MISSING:
            self._claimed -= 1

    def __setitem__(self, slot: int, who: str | None) -> None:
        self._forget(slot)
        super().__setitem__(slot, who)
        if who is None:
            self._free.add(slot)
            heapq.heappush(self._heap, slot)
            if len(self._heap) > 2 * len(self._free) + 64:  # stale entries: keep the heap near its size
                self._heap = sorted(self._free)
        else:
            self._claimed += 1

    def __delitem__(self, slot: int) -> None:
        self._forget(slot)
        super().__delitem__(slot)

    def pop(self, slot, *default):
        if slot in self:
            self._forget(slot)
        return super().pop(slot, *default)

    def popitem(self):
        slot, who = super().popitem()
        super().__setitem__(slot, who)
        self._forget(slot)
        super().__delitem__(slot)
        return slot, who

    def clear(self) -> None:
        super().clear()
        self._free.clear()
        self._heap.clear()
        self._claimed = 0

    def setdefault(self, slot, default=None):
        if slot not in self:
            self[slot] = default
        return self[slot]

    def update(self, *args, **kwargs) -> None:
        for slot, who in dict(*args, **kwargs).items():
            self[slot] = who

    def __reduce__(self):
        return (ClaimTable, (dict(self),))
