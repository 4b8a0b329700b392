"""Spine → ordered leaves → nodes, and where a gang of pods goes in it.

Leaves of a spine are ordered (natural sort of the label values unless the config lists an order);
neighbours in that order are adjacent. A gang goes to the lowest switch that can hold it: one leaf if
one can, else the fewest adjacent leaves of one spine, else the fewest spines; among equally small
choices the tightest one (least spare capacity) wins (the least loaded one for a latency-sensitive gang),
then the first in topology order. Capacities count pods: a node may take several pods of one gang.
`spread` mode instead deals pods one per leaf in turn over the chosen spine(s).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from gpuledger.core.pods.objects import natural_key

LeafKey = tuple[str, str]  # (spine, leaf)


@dataclass(frozen=True)
class Topology:
    spines: tuple[str, ...]
    leaves_of: dict[str, tuple[LeafKey, ...]]  # spine -> its leaves, in adjacency order

    @classmethod
    def build(cls, leaves: Iterable[LeafKey], leaf_order: tuple[str, ...] = ()) -> Topology:
        rank = {name: i for i, name in enumerate(leaf_order)}
        by_spine: dict[str, list[LeafKey]] = {}
        for key in set(leaves):
            by_spine.setdefault(key[0], []).append(key)

        def leaf_sort(key: LeafKey):
            name = key[1]
            return (0, rank[name], ()) if name in rank else (1, 0, natural_key(name))

        spines = tuple(sorted(by_spine, key=natural_key))
        return cls(spines, {s: tuple(sorted(by_spine[s], key=leaf_sort)) for s in spines})

    def order(self) -> list[LeafKey]:
        return [leaf for s in self.spines for leaf in self.leaves_of[s]]

    def spine_of(self, leaf: LeafKey) -> str:
        return leaf[0]


def _best_window(
    leaves: tuple[LeafKey, ...], caps: dict[LeafKey, int], need: int, prefer_spare: bool = False
):
    """(width, spare, start) of the narrowest run of adjacent leaves holding `need`: the tightest (least
    spare) first, or with `prefer_spare` the least loaded (most spare) first."""
    n = len(leaves)
    values = [caps.get(leaf, 0) for leaf in leaves]
    for width in range(1, n + 1):
        best = None
        total = sum(values[:width])
        for start in range(n - width + 1):
            if start:
                total += values[start + width - 1] - values[start - 1]
            if total >= need and (
                best is None or (total - need > best[1] if prefer_spare else total - need < best[1])
            ):
                best = (width, total - need, start)
        if best is not None:
            return best
    return None


def _one_leaf(
    topo: Topology, caps: dict[LeafKey, int], spine_caps: dict[str, int], size: int, prefer_spare: bool
) -> LeafKey | None:
    """The leaf `plan_leaves`' window search picks when some single leaf holds `size`: the tightest (or
    with `prefer_spare` the most spare), then the first spine, then the first leaf in it."""
    best = None
    for si, spine in enumerate(topo.spines):
        if spine_caps[spine] < size:
            continue
        for start, leaf in enumerate(topo.leaves_of[spine]):
            cap = caps.get(leaf, 0)
            if cap >= size:
                if cap == size and not prefer_spare:
                    return leaf  # no spare: nothing later in topology order ranks before it
                rank = (size - cap if prefer_spare else cap - size, si, start)
                if best is None or rank < best[0]:
                    best = (rank, leaf)
    return None if best is None else best[1]


def _fill(leaves: Iterable[LeafKey], caps: dict[LeafKey, int], need: int) -> list[tuple[LeafKey, int]]:
    out = []
    for leaf in leaves:
        if need <= 0:
            break
        take = min(caps.get(leaf, 0), need)
        if take > 0:
            out.append((leaf, take))
            need -= take
    return out


def plan_leaves(
    topo: Topology,
    caps: dict[LeafKey, int],
    size: int,
    spread: bool = False,
    prefer_spare: bool = False,
    spine_caps: dict[str, int] | None = None,
) -> list[tuple[LeafKey, int]] | None:
    """How many pods of a gang of `size` go to which leaf, given each leaf's capacity (the pods its nodes can
    take), or None when the cluster cannot hold the gang. `prefer_spare` (latency-sensitive gangs) breaks
    ties between equally narrow windows towards the least loaded one instead of the tightest. `spine_caps`,
    when given, is each spine's sum of `caps` (kept by the caller)."""
    if size <= 0:
        return []
    if spine_caps is None:
        spine_caps = {s: sum(caps.get(leaf, 0) for leaf in topo.leaves_of[s]) for s in topo.spines}
    if sum(spine_caps.values()) < size:
        return None
    if not spread:
        one = _one_leaf(topo, caps, spine_caps, size, prefer_spare)
        if one is not None:  # a window of one leaf is the narrowest: the same answer as the search below
            return [(one, size)]
        best = None  # (width, spare, spine position, start)
        for si, spine in enumerate(topo.spines):
            if spine_caps[spine] < size:
                continue
            w = _best_window(topo.leaves_of[spine], caps, size, prefer_spare)
            rank = (w[0], -w[1] if prefer_spare else w[1], si, w[2]) if w is not None else None
            if rank is not None and (best is None or rank < best):
                best = rank
        if best is not None:
            width, _, si, start = best
            return _fill(topo.leaves_of[topo.spines[si]][start : start + width], caps, size)
    # several spines (or spread): fewest spines, largest first; ties keep topology order
    ranked = sorted(range(len(topo.spines)), key=lambda i: (-spine_caps[topo.spines[i]], i))
    chosen: list[int] = []
    total = 0
    for i in ranked:
        if total >= size:
            break
        if spine_caps[topo.spines[i]] > 0:
            chosen.append(i)
            total += spine_caps[topo.spines[i]]
    if spread:
        leaves = [leaf for i in sorted(chosen) for leaf in topo.leaves_of[topo.spines[i]]]
        left = {leaf: caps.get(leaf, 0) for leaf in leaves}
        counts: dict[LeafKey, int] = {}
        remaining = size
        while remaining > 0:
            for leaf in leaves:
                if remaining and left[leaf] > 0:
                    left[leaf] -= 1
                    counts[leaf] = counts.get(leaf, 0) + 1
                    remaining -= 1
        return [(leaf, counts[leaf]) for leaf in leaves if counts.get(leaf)]
    # fill the larger spines whole; the last (smallest) one takes the rest in its tightest window
    out: list[tuple[LeafKey, int]] = []
    remaining = size
    for i in chosen[:-1]:
        part = _fill(topo.leaves_of[topo.spines[i]], caps, remaining)
        out += part
        remaining -= sum(c for _, c in part)
    last = topo.leaves_of[topo.spines[chosen[-1]]]
    w = _best_window(last, caps, remaining, prefer_spare)
    if w is None:
        return None
    width, _, start = w
    out += _fill(last[start : start + width], caps, remaining)
    order = {leaf: i for i, leaf in enumerate(topo.order())}
    return sorted(out, key=lambda x: order[x[0]])
