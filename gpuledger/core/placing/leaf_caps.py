"""Upper bounds on how many pods of a gang each leaf (and spine) can take, kept per gang shape and refreshed
from `ClusterIndex.touched` for the leaves whose nodes changed since, so planning a gang on a cluster of
thousands of leaves does not recount every leaf.
"""

from __future__ import annotations

from collections import OrderedDict

from gpuledger.core.books.topology import Topology
from gpuledger.core.nodes.inventory import ClusterIndex, _Buckets
from gpuledger.core.nodes.node_state import LeafKey

SHAPES = 8  # gang shapes (GPUs per pod, node and pod limits per leaf) whose bounds are kept current


def upper(b: _Buckets | None, per_pod: int, node_limit: int, pod_limit: int) -> int:
    """Pods of `per_pod` whole GPUs (0: a shared or CPU pod, one per node) the leaf's placeable nodes could
    take by their whole-free counts alone, at most `node_limit` nodes and `pod_limit` pods."""
    if b is None:
        return 0
    total, nodes = 0, 0
    for k in sorted((k for k, names in b.by_free.items() if names and k >= per_pod), reverse=True):
        take = min(len(b.by_free[k]), node_limit - nodes)
        total += take * (min(k // per_pod, pod_limit) if per_pod else 1)
        nodes += take
        if nodes >= node_limit:
            break
    return min(total, pod_limit)


class _Bounds:
    __slots__ = ("topo", "seq", "caps", "spines")

    def __init__(self, topo: Topology, seq: int, caps: dict[LeafKey, int], spines: dict[str, int]):
        self.topo, self.seq, self.caps, self.spines = topo, seq, caps, spines


class LeafCaps:
    """Per gang shape: every leaf's upper bound in topology order, and their sum per spine."""

    def __init__(self, index: ClusterIndex):
        self.index = index
        self.kept: OrderedDict[tuple[int, int, int], _Bounds] = OrderedDict()

    def bounds(
        self, topo: Topology, per_pod: int, node_limit: int, pod_limit: int
    ) -> tuple[dict[LeafKey, int], dict[str, int]]:
        """(leaf -> upper bound, spine -> sum of its leaves' bounds), copies the caller may change."""
        index = self.index
        log, base = index.touched, index.touched_base
        shape = (per_pod, node_limit, pod_limit)
        kept = self.kept.get(shape)
        if kept is None or kept.topo is not topo or kept.seq < base:
            leaves = index.leaves
            caps = {leaf: upper(leaves.get(leaf), *shape) for leaf in topo.order()}
            spines = {s: sum(caps[leaf] for leaf in topo.leaves_of[s]) for s in topo.spines}
            kept = self.kept[shape] = _Bounds(topo, base + len(log), caps, spines)
            if len(self.kept) > SHAPES:
                self.kept.popitem(last=False)
        else:
            self.kept.move_to_end(shape)
            if kept.seq < base + len(log):
                nodes, gone = index.nodes, index.gone
                stale = set()
                for name in set(log[kept.seq - base :]):
                    node = nodes.get(name)
                    if node is not None:
                        stale.add(node.leaf_key)
                    if name in gone:  # removed (and maybe back elsewhere): the leaves it left changed too
                        stale |= gone[name]
                caps, spines, leaves = kept.caps, kept.spines, index.leaves
                for leaf in stale:
                    if leaf in caps:  # a node gone takes its leaf out of the topology (rebuilt above)
                        new = upper(leaves.get(leaf), *shape)
                        spines[leaf[0]] += new - caps[leaf]
                        caps[leaf] = new
                kept.seq = base + len(log)
        return dict(kept.caps), dict(kept.spines)
