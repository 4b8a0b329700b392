"""Nodes grouped into classes by everything an FGD evaluation reads (GPU model, devices, health and free
state): every node of a class scores the same for every request, so a request costs one evaluation per class
and a merge of name-sorted lists, not a pass over every node. It must never order nodes differently from
scoring each one (tests/strategies/test_fgd_classes.py checks it against the full scan).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort
from collections.abc import Callable, Iterator


class StateClasses:
    """Per ledger index: node name -> its class key; class key -> the names in it, sorted.

    Kept current from `ClusterIndex.touched` (the names whose state or presence changed since the last read),
    so keeping it costs O(changes) per request. `results` memoises each class key's evaluation per request
    shape while the meter (the target workload) and the model capacity stay the same, also while no node is
    in that state. `capacity` (healthy GPU milli per model over placeable nodes) and `free` (their free GPU
    milli per model) are kept the same way; only a change of `capacity` moves `capacity_version`.
    """

    __slots__ = (
        "index",
        "seen",
        "key_of",
        "members",
        "results",
        "meter",
        "capacity",
        "capacity_version",
        "free",
        "_held",
        "_held_free",
    )

    def __init__(self, index) -> None:
        self.index = index
        self.seen = -1  # position in the index's whole touched history this is current up to
        self.key_of: dict[str, tuple] = {}
        self.members: dict[tuple, list[str]] = {}
        self.results: dict[tuple, dict] = {}
        self.meter = None
        # healthy GPU milli of the placeable nodes per GPU model; the version moves whenever it changes
        self.capacity: dict[str, int] = {}
        self.capacity_version = 0
        self._held: dict[str, tuple[str, int]] = {}  # node -> (model, milli) it adds to `capacity`
        self.free: dict[str, int] = {}  # free GPU milli of the placeable nodes per GPU model
        self._held_free: dict[str, tuple[str, int]] = {}  # node -> (model, milli) it adds to `free`

    def sync(self, class_key: Callable[[object], tuple | None]) -> None:
        """Re-file the nodes touched since the last call (every node, the first time or after the log was
        trimmed past our position), and keep the capacity per GPU model."""
        index = self.index
        log, base = index.touched, index.touched_base
        if self.seen < base:
            self.key_of.clear()
            self.members.clear()
            self.results.clear()
            self.capacity.clear()
            self._held.clear()
            self.free.clear()
            self._held_free.clear()
            self.capacity_version += 1
            names = index.nodes.keys()
        else:
            start = self.seen - base
            if start == len(log):
                return
            names = dict.fromkeys(log[start:]) if len(log) - start > 1 else log[start:]
        nodes = index.nodes
        for name in names:
            node = nodes.get(name)
            self._refile(name, None if node is None else class_key(node))
            self._count(name, node)
        self.seen = base + len(log)

    def use(self, token) -> None:
        """Drop memoised results when what they were computed for (meter, model capacity) changed."""
        if token is not self.meter:
            self.results.clear()
            self.meter = token

    def _count(self, name: str, node) -> None:
        held = free = None
        if node is not None and node.placeable and node.total_milli and node.info.product:
            held = (node.info.product, node.total_milli)
            free = (node.info.product, node.free_milli)
        _move(self.free, self._held_free, name, free)
        if _move(self.capacity, self._held, name, held):
            self.capacity_version += 1

    def _refile(self, name: str, key: tuple | None) -> None:
        old = self.key_of.get(name)
        if old == key:
            return
        if old is not None:
            names = self.members[old]
            del names[bisect_left(names, name)]
            if not names:
                del self.members[old]  # its results stay: nodes come back to the same states
            del self.key_of[name]
        if key is not None:
            self.key_of[name] = key
            members = self.members.get(key)
            if members is None:
                self.members[key] = [name]
            else:
                insort(members, name)

    def ranked(
        self, fits: Callable[[object], bool], evaluate: Callable[[object], tuple | None], shape: tuple
    ) -> list[tuple]:
        """(increase, first name, names, result) of each class whose nodes hold the request, best first."""
        nodes, results = self.index.nodes, self.results
        out = []
        for key, names in self.members.items():
            sample = nodes[names[0]]
            if not fits(sample):
                continue
            memo = results.get(key)
            if memo is None:
                if len(results) > 100_000:
                    results.clear()
                memo = results[key] = {}
            if shape in memo:
                result = memo[shape]
            else:
                result = memo[shape] = evaluate(sample)
            if result is not None:
                out.append((result[0], names[0], names, result))
        out.sort(key=_first_two)
        return out

    def walk(self, ranked: list[tuple]) -> Iterator[tuple]:
        """(node, its class result) by (increase, name); classes of equal increase merged by name, lazily."""
        nodes = self.index.nodes
        i, count = 0, len(ranked)
        while i < count:
            j = i + 1
            while j < count and ranked[j][0] == ranked[i][0]:
                j += 1
            if j == i + 1:
                result = ranked[i][3]
                for name in ranked[i][2]:  # the ledger mutates nothing while it walks
                    yield nodes[name], result
            else:  # the first node is usually taken: find it without building the merge (names are unique)
                tied = ranked[i:j]
                first = min(tied, key=_first_name)
                yield nodes[first[1]], first[3]
                merged = heapq.merge(*(_tagged(item[2], item[3]) for item in tied), key=_first_name_of_pair)
                for name, result in merged:
                    if name != first[1]:
                        yield nodes[name], result
            i = j


def _move(totals: dict[str, int], held: dict[str, tuple[str, int]], name: str, new: tuple | None) -> bool:
    """Move node `name`'s contribution to `totals` (model -> milli) from what it held to `new`; False when
    nothing changed."""
    old = held.get(name)
    if old == new:
        return False
    if old is not None:  # a node may hold 0 milli of a model whose total is gone (free milli): get, not []
        left = totals.get(old[0], 0) - old[1]
        if left:
            totals[old[0]] = left
        else:
            totals.pop(old[0], None)
        del held[name]
    if new is not None:
        totals[new[0]] = totals.get(new[0], 0) + new[1]
        held[name] = new
    return True


def _tagged(names: list[str], result) -> Iterator[tuple[str, object]]:
    for name in names:
        yield name, result


def _first_name(item):
    return item[1]


def _first_name_of_pair(pair):
    return pair[0]


def _first_two(item):
    return item[0], item[1]
