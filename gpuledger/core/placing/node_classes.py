"""Nodes grouped into classes by everything a denial's classification reads but the node's name and labels:
readiness, product, devices, taints, and the free state the default device choice reads. Kept current as
the index changes (the nodes added, removed or changed are re-keyed in batches of at most
`ClusterIndex.dirty_limit`: O(devices) per change), so no denial classifies node by node: a new request shape
is classified once per class, after re-keying at most that many nodes. Each move of a node
between classes is logged for the per-shape diagnoses that count nodes by class.
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, insort

from gpuledger.core.nodes import sorted_buckets
from gpuledger.core.nodes.inventory import ClusterIndex
from gpuledger.core.nodes.node_state import NodeState
from gpuledger.core.nodes.sorted_names import CHUNK, SortedNames
from gpuledger.core.steps import Steps, drain
from gpuledger.names import ACCELERATOR_LABEL


class NodeClasses:
    """Class id of every node, the name-sorted members of every class, and the log of moves between them.
    It keeps up with the index (`ClusterIndex.dirty`); after a bulk load it is built once."""

    def __init__(self, index: ClusterIndex):
        self.index = index
        self.generation = 0  # bumped by every full rebuild: readers of `moves` recount from scratch
        self.class_of: dict[str, int] = {}
        # class id -> its nodes, name-sorted (never empty): a list, a SortedNames above CHUNK nodes
        self.members: dict[int, list[str] | SortedNames] = {}
        # each move as 3 entries (node, class id before, after; None = not there): flat, so a move leaves no
        # tuple behind (one per placement would wake the cyclic collector over and over)
        self.moves: list = []
        self.moves_base = 0  # position of moves[0] in this generation's whole move history (entries)
        self._moves_limit = 3 * 1024  # entries kept before the log is trimmed (3 x (2 x nodes + 1024))
        self._ids: dict[tuple, int] = {}
        self._key_of_id: dict[int, tuple] = {}
        self._next_id = 0
        # what never changes while a NodeState lives (its info, devices, health) as a small id shared by
        # equal nodes: node -> (its state, static id); static key -> [id, nodes using it]
        self._static: dict[str, tuple[NodeState, int]] = {}
        self._static_ids: dict[tuple, list[int]] = {}
        self._static_key: dict[int, tuple] = {}
        self._next_static = 0
        index.dirty = set()
        index.on_dirty = self.refresh
        index.on_bulk_end = self._rebuild_in_steps
        self._rebuild()

    def refresh(self) -> None:
        """Re-key the nodes changed since last time: never more than `index.dirty_limit`, as the index calls
        this whenever it has that many (a node changed several times in between is re-keyed once)."""
        dirty = self.index.dirty
        if dirty:
            nodes, update = self.index.nodes, self.update
            for name in dirty:
                update(name, nodes.get(name))
            dirty.clear()

    def update(self, name: str, state: NodeState | None) -> None:
        """File a node (its `state`; None: removed) under its class."""
        class_of = self.class_of
        old = class_of.get(name)
        if state is None:
            new = None
            self._unstatic(name)
        else:
            cached = self._static.get(name)
            key = (  # self.key(state), inlined: this runs on every placement and release
                cached[1] if cached is not None and cached[0] is state else self._static_id(state),
                state.cpu_free,
                state.mem_free,
                state.unknown_gpus,
                state.owned,
                *state.dev_free_milli,
                *state.dev_free_mem,
                *state.dev_nshares,
            )
            new = self._ids.get(key)
            if new is None:  # a class not seen (or emptied) before: most nodes are one of a kind
                new = self._ids[key] = self._next_id
                self._key_of_id[new] = key
                self._next_id += 1
        if old != new:
            members = self.members
            if old is not None:
                group = members[old]
                if len(group) == 1:
                    del members[old]
                    del self._ids[self._key_of_id.pop(old)]
                else:  # a class's members stay chunked once they were (it is deleted when it empties)
                    sorted_buckets.discard(members, old, name, short=0)
            if new is None:
                del class_of[name]
            else:
                class_of[name] = new
                # a plain list while small (one object for the collector, not three), chunked past CHUNK
                sorted_buckets.add(members, new, name, long=CHUNK)
        moves = self.moves
        moves.extend((name, old, new))  # also when unchanged: the node's own detail may have
        if len(moves) > self._moves_limit:
            self.moves_base += len(moves)
            moves.clear()
            self._moves_limit = 3 * (2 * len(self.index.nodes) + 1024)

    def _rebuild(self) -> None:
        """Every node keyed from scratch (a new ledger, or after a bulk load): O(nodes)."""
        drain(self._rebuild_in_steps(0))

    def _rebuild_in_steps(self, step: int) -> Steps[None]:
        """`_rebuild`, pausing after keying every `step` nodes (0: never); nothing reads the classes until it
        is done (the end of a bulk load: gpuledger.core.nodes.inventory)."""
        self.generation += 1
        self.index.dirty.clear()  # type: ignore[union-attr]
        self.moves, self.moves_base = [], 0
        self._moves_limit = 3 * (2 * len(self.index.nodes) + 1024)
        self.class_of = {}
        self._ids, self._key_of_id = {}, {}
        nodes = self.index.nodes
        class_of, ident, key = self.class_of, self._id, self.key
        grouped: dict[int, list[str]] = {}
        left = step
        for name in self.index.sorted_names():
            cid = class_of[name] = ident(key(nodes[name]))
            group = grouped.get(cid)
            if group is None:
                grouped[cid] = [name]
            else:
                group.append(name)
            left -= 1
            if not left:
                yield
                left = step
        self.members = sorted_buckets.settle(grouped, long=CHUNK)
        for name in [n for n in self._static if n not in nodes]:
            self._unstatic(name)

    def _id(self, key: tuple) -> int:
        cid = self._ids.get(key)
        if cid is None:
            cid = self._ids[key] = self._next_id
            self._key_of_id[cid] = key
            self._next_id += 1
        return cid

    def _static_id(self, node: NodeState) -> int:
        """The id of what `key` reads of a node that only a new NodeState changes (not labels)."""
        cached = self._static.get(node.name)
        if cached is not None:
            if cached[0] is node:
                return cached[1]
            self._unstatic(node.name)
        info = node.info
        static = (
            info.ready,
            info.unschedulable,
            info.gpu_schedulable,
            info.product,
            info.label(ACCELERATOR_LABEL, "") or "",
            tuple([(d.product, d.memory_mib, d.healthy) for d in info.devices]),
            info.taints,
            tuple(node.dev_index),
            tuple(node.dev_mem_total),
            tuple(node.dev_healthy),
            tuple(sorted(node.external)),
        )
        entry = self._static_ids.get(static)
        if entry is None:
            entry = self._static_ids[static] = [self._next_static, 0]
            self._static_key[self._next_static] = static
            self._next_static += 1
        entry[1] += 1
        self._static[node.name] = (node, entry[0])
        return entry[0]

    def _unstatic(self, name: str) -> None:
        cached = self._static.pop(name, None)
        if cached is None:
            return
        static = self._static_key[cached[1]]
        entry = self._static_ids[static]
        entry[1] -= 1
        if not entry[1]:
            del self._static_ids[static], self._static_key[cached[1]]

    def key(self, node: NodeState) -> tuple:
        """What `Diagnoser.classify` reads of a node for a request without node selectors, affinity or a
        bandwidth ask (the static filters' inputs but labels, and the default device choice's). Equal
        static ids mean equal device counts, so the per-device runs below line up."""
        cached = self._static.get(node.name)
        return (
            cached[1] if cached is not None and cached[0] is node else self._static_id(node),
            node.cpu_free,
            node.mem_free,
            node.unknown_gpus,
            node.owned,
            *node.dev_free_milli,
            *node.dev_free_mem,
            *node.dev_nshares,
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
        for name, old, new in zip(moves[0::3], moves[1::3], moves[2::3], strict=True):
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
            verdict = self.verdict[cid] = self.classify(nodes[next(iter(self.classes.members[cid]))])
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
