"""Nodes grouped into classes by everything a denial's classification reads but the node's name and labels:
readiness, product, devices, taints, and the free state the default device choice reads. Kept current from
`ClusterIndex.touched`, so a new request shape is classified once per class, not once per node; each move of
a node between classes is logged for the per-shape diagnoses that count nodes by class.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort

from allocator.core import objects as kube
from allocator.core.inventory import ClusterIndex
from allocator.core.model import NodeInfo
from allocator.core.node_state import NodeState

Move = tuple[str, int | None, int | None]  # (node, class id before, class id after; None = not there)


class NodeClasses:
    """Class id of every node, the name-sorted members of every class, and the log of moves between them."""

    def __init__(self, index: ClusterIndex):
        self.index = index
        self.generation = 0  # bumped by every full rebuild: readers of `moves` recount from scratch
        self.seq = 0  # position in the index's whole `touched` history read up to
        self.class_of: dict[str, int] = {}
        self.members: dict[int, list[str]] = {}  # class id -> its nodes, name-sorted (never empty)
        self.moves: list[Move] = []
        self.moves_base = 0  # position of moves[0] in this generation's whole move history
        self._ids: dict[tuple, int] = {}
        self._key_of_id: dict[int, tuple] = {}
        self._next_id = 0
        self._static: dict[str, tuple[NodeInfo, tuple]] = {}

    def refresh(self) -> None:
        """Bring classes current with the index: O(nodes touched since), or every node the first time and
        after the index trimmed changes not read yet."""
        index = self.index
        log, base = index.touched, index.touched_base
        if not self.generation or self.seq < base:
            self._rebuild()
        elif self.seq < base + len(log):
            nodes = index.nodes
            moves = self.moves
            for name in set(log[self.seq - base :]):
                state = nodes.get(name)
                old = self.class_of.get(name)
                new = None if state is None else self._id(self.key(state))
                if old != new:
                    if old is not None:
                        self._leave(name, old)
                    if new is None:
                        del self.class_of[name]
                    else:
                        self.class_of[name] = new
                        group = self.members.get(new)
                        if group is None:
                            self.members[new] = [name]
                        else:
                            insort(group, name)
                moves.append((name, old, new))  # also when unchanged: the node's own detail may have
            if len(moves) > 2 * len(nodes) + 1024:
                self.moves_base += len(moves)
                moves.clear()
        self.seq = base + len(log)

    def _leave(self, name: str, cid: int) -> None:
        group = self.members[cid]
        del group[bisect_left(group, name)]
        if not group:
            del self.members[cid]
            del self._ids[self._key_of_id.pop(cid)]

    def _rebuild(self) -> None:
        self.generation += 1
        self.moves, self.moves_base = [], 0
        self.class_of, self.members = {}, {}
        self._ids, self._key_of_id = {}, {}
        nodes = self.index.nodes
        class_of, members, ident, key = self.class_of, self.members, self._id, self.key
        for name in self.index.sorted_names():
            cid = class_of[name] = ident(key(nodes[name]))
            group = members.get(cid)
            if group is None:
                members[cid] = [name]
            else:
                group.append(name)
        live = set(self.index.nodes)
        for name in [n for n in self._static if n not in live]:
            del self._static[name]

    def _id(self, key: tuple) -> int:
        cid = self._ids.get(key)
        if cid is None:
            cid = self._ids[key] = self._next_id
            self._key_of_id[cid] = key
            self._next_id += 1
        return cid

    def key(self, node: NodeState) -> tuple:
        """What `Diagnoser.classify` reads of a node for a request without node selectors, affinity or a
        bandwidth ask (the static filters' inputs but labels, and the default device choice's)."""
        info = node.info
        cached = self._static.get(node.name)
        if cached is None or cached[0] is not info:
            static = (
                info.ready,
                info.unschedulable,
                info.gpu_schedulable,
                info.product,
                info.label(kube.ACCELERATOR_LABEL, "") or "",
                tuple([(d.product, d.memory_mib, d.healthy) for d in info.devices]),
                info.taints,
                len(node.dev_index),  # the lengths of what follows in the key, so equal keys line up
                *node.dev_index,
                *node.dev_mem_total,
            )
            cached = self._static[node.name] = (info, static)
        return (
            cached[1],
            node.cpu_free,
            node.mem_free,
            node.unknown_gpus,
            *node.dev_healthy,
            *node.dev_free_milli,
            *node.dev_free_mem,
            *[o is None for o in node.dev_owner],
            *node.dev_nshares,
            *sorted(node.external),
        )


class ClassDiagnosis:
    """One request shape's denial classification counted by class: each class classified once (through a
    member), nodes per reason, the classes with each reason, and near-miss classes in order; `seq` is the
    position in the classes' moves it is current up to."""

    __slots__ = (
        "classes",
        "classify",
        "counts",
        "fitting",
        "generation",
        "misses",
        "near",
        "seq",
        "size",
        "verdict",
        "with_reason",
    )

    def __init__(self, classes: NodeClasses, classify) -> None:
        self.classes = classes
        self.classify = classify  # node -> (reason or None, near-miss key without the name, or None)
        self.generation = classes.generation
        self.seq = classes.moves_base + len(classes.moves)
        self.verdict: dict[int, tuple] = {}  # class id -> (reason or None, near key or None)
        self.size: dict[int, int] = {}  # class id -> nodes counted in it
        self.counts: dict = {}  # reason -> nodes
        self.fitting = 0
        self.with_reason: dict = {}  # reason -> class ids counted under it
        self.near: list[tuple] = []  # sorted (near key, class id) of counted classes that are near misses
        self.misses: dict = {}  # node -> its NearMiss, valid until the node is touched
        nodes = classes.index.nodes
        for cid, names in classes.members.items():
            self._count(cid, len(names), nodes, bulk=True)
        self.near.sort()

    def current(self) -> bool:
        """Follow the classes' moves since last read; False when it must be rebuilt instead."""
        classes = self.classes
        if self.generation != classes.generation or self.seq < classes.moves_base:
            return False
        moves = classes.moves[self.seq - classes.moves_base :]
        self.seq = classes.moves_base + len(classes.moves)
        if not moves:
            return True
        net: dict[str, tuple] = {}
        for name, old, new in moves:
            was = net.get(name)
            net[name] = (old if was is None else was[0], new)
        nodes = classes.index.nodes
        misses = self.misses
        for name, (old, new) in net.items():
            misses.pop(name, None)
            if old != new:
                if old is not None:
                    self._count(old, -1, nodes)
                if new is not None:
                    self._count(new, 1, nodes)
        return True

    def _count(self, cid: int, delta: int, nodes, bulk: bool = False) -> None:
        verdict = self.verdict.get(cid)
        if verdict is None:
            verdict = self.verdict[cid] = self.classify(nodes[self.classes.members[cid][0]])
        reason, key = verdict
        before = self.size.get(cid, 0)
        after = self.size[cid] = before + delta
        if reason is None:
            self.fitting += delta
        else:
            left = self.counts[reason] = self.counts.get(reason, 0) + delta
            if not left:
                del self.counts[reason]
        if before and after:
            return
        if after:  # a class newly counted
            if reason is not None:
                self.with_reason.setdefault(reason, set()).add(cid)
            if key is not None:
                if bulk:
                    self.near.append((key, cid))
                else:
                    insort(self.near, (key, cid))
            return
        del self.size[cid], self.verdict[cid]  # a class no longer counted: its id may never return
        if reason is not None:
            group = self.with_reason[reason]
            group.discard(cid)
            if not group:
                del self.with_reason[reason]
        if key is not None:
            del self.near[bisect_left(self.near, (key, cid))]

    def reason_of(self, name: str):
        return self.verdict[self.classes.class_of[name]][0]

    def names(self, reason, limit: int, exclude) -> list[str] | None:
        """The nodes counted under a reason (name-sorted, the excluded left out), or None when more than
        `limit`."""
        members = self.classes.members
        out: list[str] = []
        for cid in self.with_reason.get(reason, ()):
            out.extend(n for n in members[cid] if n not in exclude)
            if len(out) > limit:
                return None
        return sorted(out)

    def nearest(self, count: int, exclude) -> list[str]:
        """The first `count` near-miss nodes in (near key, name) order, the excluded left out."""
        members = self.classes.members
        out: list[str] = []
        near = self.near
        i = 0
        while i < len(near) and len(out) < count:
            j = i + 1
            while j < len(near) and near[j][0] == near[i][0]:
                j += 1
            group = members[near[i][1]] if j == i + 1 else heapq.merge(*(members[c] for _, c in near[i:j]))
            for name in group:
                if name not in exclude:
                    out.append(name)
                    if len(out) == count:
                        break
            i = j
        return out
