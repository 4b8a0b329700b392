"""The cluster index: placeable nodes bucketed by whole-free GPUs, globally and per leaf, so a strategy finds
a node without scanning them all. It never changes a node's counters itself: the ledger runs the mutation
through `change`, and the index re-files the node.

Each bucket is a name-sorted list, so strategies that prefer fewer/more free GPUs walk buckets in score order
and stop at the first node that fits. Each bucket is also kept sorted by `fit_key` (free CPU and free
milli-GPU, each weighted by the other's cluster maximum), the order of best fit.
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections import Counter
from collections.abc import Callable

from gpuledger.core.model import MILLI_PER_GPU, NodeInfo
from gpuledger.core.nodes import sorted_buckets
from gpuledger.core.nodes.node_state import LeafKey, NodeState
from gpuledger.core.nodes.sorted_buckets import Bucket
from gpuledger.core.steps import Steps, drain
from gpuledger.names import AGENT_NETWORK_BANDWIDTH_LABEL, NETWORK_BANDWIDTH_LABEL

# what a node says of its network bandwidth: the operator's label, read first, then the node agent's
BANDWIDTH_LABELS = (NETWORK_BANDWIDTH_LABEL, AGENT_NETWORK_BANDWIDTH_LABEL)


def says_bandwidth(info: NodeInfo) -> bool:
    """Whether the node carries either bandwidth label (readable or not)."""
    return any(info.label(key) is not None for key in BANDWIDTH_LABELS)


class _Buckets:
    """Name-sorted buckets of node names keyed by whole-free GPU count (lists, or SortedNames once long:
    gpuledger.core.nodes.sorted_buckets)."""

    __slots__ = ("by_free", "total_whole", "total_milli", "free_milli", "count")

    def __init__(self) -> None:
        self.by_free: dict[int, Bucket[str]] = {}
        self.total_whole = 0  # sum of whole_free
        self.total_milli = 0
        self.free_milli = 0
        self.count = 0

    def add(self, name: str, k: int) -> None:
        sorted_buckets.add(self.by_free, k, name)

    def discard(self, name: str, k: int) -> None:
        sorted_buckets.discard(self.by_free, k, name)

    def keys_from(self, need: int, descending: bool = False) -> list[int]:
        keys = [k for k, b in self.by_free.items() if k >= need and b]
        keys.sort(reverse=descending)
        return keys


class ClusterIndex:
    """Placeable nodes bucketed by whole-free GPUs, globally and per leaf; per-leaf free totals."""

    def __init__(self) -> None:
        self.nodes: dict[str, NodeState] = {}
        self.all = _Buckets()
        self.leaves: dict[LeafKey, _Buckets] = {}
        self._key: dict[str, int] = {}  # name -> bucket key it is filed under (placeable nodes only)
        # leaves by their whole-free total, for strategies that rank leaves (consolidated, distributed)
        self.leaves_by_total: dict[int, set[LeafKey]] = {}
        self.leaf_members: dict[LeafKey, int] = {}  # nodes per leaf, placeable or not
        self._sorted_names: list[str] | None = None
        # names of nodes added, removed or changed, oldest first; `touched_base` is the position of touched[0]
        # in the whole history, so a reader that remembers a position re-reads only what changed since
        self.touched: list[str] = []
        self.touched_base = 0
        # the leaves each node was removed from since touched[0] (a node may leave, come back elsewhere and
        # leave again between two reads): a reader of `touched` finds a gone node's leaves here
        self.gone: dict[str, set[LeafKey]] = {}
        # per leaf total: sorted (-most whole-free, first name in that bucket, leaf) of each leaf with
        # placeable nodes, so a walk that ranks leaves by total finds a tied group's first node without
        # merging its leaves; recomputed lazily for the leaves in `_stale_heads`
        self._heads: dict[int, list[tuple[int, str, LeafKey]]] = {}
        self._head_of: dict[LeafKey, tuple[int, tuple[int, str, LeafKey]]] = {}
        self._stale_heads: set[LeafKey] = set()
        # best fit's order: whole-free count -> sorted (fit_key, name) of the placeable nodes with that count;
        # rebuilt lazily (`fit_buckets`) when a cluster maximum, and so the key's weights, changes
        self._by_fit: dict[int, Bucket[tuple[int, str]]] = {}
        self._fit_key: dict[str, int] = {}
        self._fit_stale = False
        self._cpu_sizes: Counter[int] = Counter()  # node cpu_milli -> nodes of that size (for the maximum)
        self._gpu_sizes: Counter[int] = Counter()  # node device count -> nodes
        self.max_cpu_milli = 1  # largest node CPU (at least 1, so weights are never 0)
        self.max_gpu_milli = MILLI_PER_GPU  # largest node GPU capacity in milli-GPU (at least one GPU)
        self.utilization_nodes = 0  # nodes whose agent published GPU utilization (least_utilized reads it)
        # nodes carrying a bandwidth label (`BANDWIDTH_LABELS`): while none does, a bandwidth request is
        # admitted unchecked, with a warning (gpuledger.core.placing.filters.bandwidth_unchecked)
        self.bandwidth_nodes = 0
        # every node's devices, and its healthy ones (placeable or not): what stats reports without a walk
        self.gpus_total = 0
        self.gpus_healthy = 0
        self._bulk = False  # a bulk load: nodes added are filed by `end_bulk`
        # the node classes (gpuledger.core.placing.node_classes) keep up with the index: every node added,
        # removed or changed goes into `dirty`, and `on_dirty` is called once `dirty_limit` are there (not
        # during a bulk load, after which `on_bulk_end` is called), so the classes are never more than that
        # behind
        self.dirty: set[str] | None = None
        self.dirty_limit = 256
        self.on_dirty: Callable[[], None] | None = None
        # called with a step (objects between pauses, 0: none): a generator, pausing like `end_bulk_in_steps`
        self.on_bulk_end: Callable[[int], Steps[None]] | None = None

    # ------------------------------------------------------------------ best fit's order
    def fit_key(self, node: NodeState) -> int:
        """free cpu / max cpu + free milli-GPU / max milli-GPU, scaled by both maxima to stay an exact
        integer."""
        return node.cpu_free * self.max_gpu_milli + node.free_milli * self.max_cpu_milli

    def fit_buckets(self) -> dict[int, Bucket[tuple[int, str]]]:
        """Whole-free count -> (fit_key, name) of the placeable nodes with that count, ascending."""
        if self._fit_stale:
            by_fit: dict[int, list[tuple[int, str]]] = {}
            keys = self._fit_key
            keys.clear()
            nodes = self.nodes
            for name, k in self._key.items():
                key = keys[name] = self.fit_key(nodes[name])
                by_fit.setdefault(k, []).append((key, name))
            for entries in by_fit.values():
                entries.sort()
            self._by_fit = sorted_buckets.settle(by_fit)
            self._fit_stale = False
        return self._by_fit

    def begin_bulk(self) -> None:
        """A bulk load (a rebuild): nodes added from now on are filed in the buckets only by `end_bulk`, and
        best fit's order is sorted once when next read, instead of a sorted insert into lists of every node
        per change (each a move of up to the whole list)."""
        self._bulk = True
        self._fit_stale = True
        self._by_fit = {}

    @property
    def bulk(self) -> bool:
        """Whether a bulk load is under way (between `begin_bulk` and `end_bulk`)."""
        return self._bulk

    def end_bulk(self) -> None:
        """File every placeable node added during the bulk load, in name order (each insert appends)."""
        drain(self.end_bulk_in_steps(0))

    def end_bulk_in_steps(self, step: int) -> Steps[None]:
        """`end_bulk`, pausing after every `step` nodes (0: never): ~0.7 s at 65,000 nodes."""
        self._bulk = False
        left = step
        for name in self.sorted_names():
            node = self.nodes[name]
            if node.placeable and name not in self._key:
                self._file(node)
            left -= 1
            if not left:
                yield
                left = step
        if self.on_bulk_end is not None:
            yield from self.on_bulk_end(step)

    def _size(self, node: NodeState, delta: int) -> None:
        """Count the node's CPU and GPU size in or out; a changed maximum re-weights every fit key."""
        cpu, gpus = node.info.cpu_milli, len(node.dev_index)
        self.gpus_total += delta * gpus
        self.gpus_healthy += delta * (node.total_milli // MILLI_PER_GPU)  # a healthy device is 1,000 milli
        for sizes, value in ((self._cpu_sizes, cpu), (self._gpu_sizes, gpus)):
            sizes[value] += delta
            if sizes[value] <= 0:
                del sizes[value]
        max_cpu = max(1, max(self._cpu_sizes, default=1))
        max_gpu = max(1, max(self._gpu_sizes, default=1)) * MILLI_PER_GPU
        if (max_cpu, max_gpu) != (self.max_cpu_milli, self.max_gpu_milli):
            self.max_cpu_milli, self.max_gpu_milli = max_cpu, max_gpu
            if self._key:  # (with no node filed yet there is nothing to re-weight: the first node sets them)
                self._fit_stale = True
                self._by_fit = {}

    def _fit_file(self, name: str, k: int, key: int) -> None:
        self._fit_key[name] = key
        sorted_buckets.add(self._by_fit, k, (key, name))

    def _fit_unfile(self, name: str, k: int) -> None:
        sorted_buckets.discard(self._by_fit, k, (self._fit_key.pop(name), name))

    def _dirty(self, name: str) -> None:
        dirty = self.dirty
        if dirty is not None:
            dirty.add(name)
            if len(dirty) >= self.dirty_limit and not self._bulk:
                self.on_dirty()  # type: ignore[misc]

    def touch(self, name: str) -> None:
        """Record that a node's free state or presence changed (readers of `touched` recompute it)."""
        log = self.touched
        log.append(name)
        if len(log) > 2 * len(self.nodes) + 1024:  # readers this far behind recompute everything anyway
            self.touched_base += len(log)
            log.clear()
            self.gone.clear()

    def sorted_names(self) -> list[str]:
        if self._sorted_names is None:
            self._sorted_names = sorted(self.nodes)
        return self._sorted_names

    def first_most_free(self, total: int) -> tuple[int, str] | None:
        """(whole-free, name) of the node with the most whole-free GPUs, then the lowest name, among the
        leaves whose whole-free total is `total`: the first node `bucket_walk(..., descending=True)` yields
        over them."""
        if self._stale_heads:
            self._refresh_heads()
        entries = self._heads.get(total)
        if not entries:
            return None
        k, name, _ = entries[0]
        return -k, name

    def _refresh_heads(self) -> None:
        heads = self._heads
        for key in self._stale_heads:
            old = self._head_of.pop(key, None)
            if old is not None:
                entries = heads[old[0]]
                del entries[bisect_left(entries, old[1])]
                if not entries:
                    del heads[old[0]]
            b = self.leaves.get(key)
            if b is None:
                continue
            top = max((k for k, names in b.by_free.items() if names), default=None)
            if top is None:
                continue
            entry = (-top, b.by_free[top][0], key)
            self._head_of[key] = (b.total_whole, entry)
            group = heads.get(b.total_whole)
            if group is None:
                heads[b.total_whole] = [entry]
            else:
                insort(group, entry)
        self._stale_heads.clear()

    def leaf(self, key: LeafKey) -> _Buckets:
        b = self.leaves.get(key)
        if b is None:
            b = self.leaves[key] = _Buckets()
            self.leaves_by_total.setdefault(0, set()).add(key)
        return b

    def _leaf_total(self, key: LeafKey, b: _Buckets, delta: int) -> None:
        if not delta:
            return
        group = self.leaves_by_total[b.total_whole]
        group.discard(key)
        if not group:
            del self.leaves_by_total[b.total_whole]
        b.total_whole += delta
        self.leaves_by_total.setdefault(b.total_whole, set()).add(key)

    def add(self, node: NodeState) -> None:
        self.nodes[node.name] = node
        self._sorted_names = None
        self.touch(node.name)
        self.leaf(node.leaf_key)
        self.leaf_members[node.leaf_key] = self.leaf_members.get(node.leaf_key, 0) + 1
        self.utilization_nodes += node.info.utilization_at is not None
        self.bandwidth_nodes += says_bandwidth(node.info)
        self._size(node, 1)
        if node.placeable and not self._bulk:
            self._file(node)
        self._dirty(node.name)

    def remove(self, name: str) -> NodeState | None:
        node = self.nodes.pop(name, None)
        if node is None:
            return None
        self._sorted_names = None
        self.touch(name)
        self.gone.setdefault(name, set()).add(node.leaf_key)
        self._unfile(node)
        self._size(node, -1)
        self.utilization_nodes -= node.info.utilization_at is not None
        self.bandwidth_nodes -= says_bandwidth(node.info)
        left = self.leaf_members[node.leaf_key] - 1
        if left:
            self.leaf_members[node.leaf_key] = left
        else:
            del self.leaf_members[node.leaf_key]
        self._dirty(name)
        return node

    def _file(self, node: NodeState) -> None:
        k = node.whole_free
        self._key[node.name] = k
        if not self._fit_stale:
            self._fit_file(node.name, k, self.fit_key(node))
        self._stale_heads.add(node.leaf_key)
        self._leaf_total(node.leaf_key, self.leaves[node.leaf_key], k)
        self.all.total_whole += k
        for b in (self.all, self.leaves[node.leaf_key]):
            b.add(node.name, k)
            b.total_milli += node.total_milli
            b.free_milli += node.free_milli
            b.count += 1

    def _unfile(self, node: NodeState) -> None:
        k = self._key.pop(node.name, None)
        if k is None:
            return
        if not self._fit_stale:
            self._fit_unfile(node.name, k)
        self._stale_heads.add(node.leaf_key)
        self._leaf_total(node.leaf_key, self.leaves[node.leaf_key], -k)
        self.all.total_whole -= k
        for b in (self.all, self.leaves[node.leaf_key]):
            b.discard(node.name, k)
            b.total_milli -= node.total_milli
            b.free_milli -= node.free_milli
            b.count -= 1

    def change(self, node: NodeState, mutate, arg) -> None:
        """Run `mutate(arg)` on a node (its bound `apply` or `remove`: no closure per call) and keep the
        buckets and leaf totals true."""
        self.touch(node.name)
        if node.name not in self._key:
            mutate(arg)
            if not self._bulk:  # (a bulk load re-keys every node once, at its end)
                self._dirty(node.name)
            return
        k_old = self._key[node.name]
        milli_old = node.free_milli
        mutate(arg)
        k_new = node.whole_free
        milli_new = node.free_milli
        if not self._fit_stale:
            name = node.name
            key = node.cpu_free * self.max_gpu_milli + milli_new * self.max_cpu_milli  # fit_key, inlined
            key_old = self._fit_key[name]
            if k_new != k_old or key != key_old:
                sorted_buckets.discard(self._by_fit, k_old, (key_old, name))
                self._fit_key[name] = key
                sorted_buckets.add(self._by_fit, k_new, (key, name))
        leaf = self.leaves[node.leaf_key]
        if k_new != k_old:
            self._leaf_total(node.leaf_key, leaf, k_new - k_old)
            self.all.total_whole += k_new - k_old
            self._stale_heads.add(node.leaf_key)
        for b in (self.all, leaf):
            if k_new != k_old:
                b.discard(node.name, k_old)
                b.add(node.name, k_new)
            b.free_milli += milli_new - milli_old
        self._key[node.name] = k_new
        dirty = self.dirty  # self._dirty(node.name), inlined: every placement and release comes here
        if dirty is not None:
            dirty.add(node.name)
            if len(dirty) >= self.dirty_limit and not self._bulk:
                self.on_dirty()  # type: ignore[misc]
