"""Best-first candidate walks over the ledger's index: nodes in a strategy's exact score order, ties by name.
A walk only orders and skips what cannot fit; it must never mutate the index or decide a placement itself.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator
from typing import TYPE_CHECKING

from gpuledger.core.model import MILLI_PER_GPU, Request

if TYPE_CHECKING:
    from gpuledger.core.nodes.inventory import ClusterIndex
    from gpuledger.core.nodes.node_state import LeafKey, NodeState


def bucket_walk(
    index: ClusterIndex, leaves: list[LeafKey] | None, need: int, descending: bool
) -> Iterator[NodeState]:
    """Placeable nodes with at least `need` whole-free GPUs, by whole-free count then name."""
    nodes = index.nodes
    if leaves is None:
        by_free = index.all.by_free
        for k in index.all.keys_from(need, descending):
            for name in by_free[k]:  # the ledger mutates nothing while it walks
                yield nodes[name]
        return
    groups = [index.leaves[leaf] for leaf in leaves if leaf in index.leaves]
    for k in index.all.keys_from(need, descending):  # the global keys hold every leaf's keys
        lists = [lst for g in groups if (lst := g.by_free.get(k))]
        if not lists:
            continue
        if len(lists) == 1:
            for name in lists[0]:
                yield nodes[name]
            continue
        # the first node is usually taken: find it without building the merge (names are unique)
        first = min(lst[0] for lst in lists)
        yield nodes[first]
        merged = heapq.merge(*lists)
        next(merged)
        for name in merged:
            yield nodes[name]


def leaf_walk(
    index: ClusterIndex,
    leaves: list[LeafKey] | None,
    need: int,
    leaf_descending: bool,
    node_descending: bool,
) -> Iterator[NodeState]:
    """Leaves ordered by their whole-free total (equal totals merged by node name), nodes by bucket.
    A leaf whose total is below `need` cannot hold a node with `need` free, so it is skipped unseen."""
    wanted = None if leaves is None else set(leaves)
    groups = index.leaves_by_total
    for total in sorted(groups, reverse=leaf_descending):
        if total < need or not groups.get(total):
            continue
        first = None
        if wanted is None and node_descending:
            # the tied group's first node, from the index's per-total heads (merging 100s of leaves for the
            # node that is usually taken is what made spreading slow); the merged walk only if it is refused
            first = index.first_most_free(total)
            if first is None or first[0] < need:
                continue  # no node in these leaves has `need` free
            yield index.nodes[first[1]]
        members = list(groups[total]) if wanted is None else list(groups[total] & wanted)  # merged by name
        if members:
            for node in bucket_walk(index, members, need, node_descending):
                if first is None or node.name != first[1]:
                    yield node


def _taken_milli(request: Request) -> int:
    return request.gpus * MILLI_PER_GPU if request.gpus > 0 else request.gpu_milli


def best_fit_cost(node: NodeState, request: Request, index: ClusterIndex) -> int:
    """best fit's node cost as an exact integer: `fit_key` after placement (lower is a tighter fit)."""
    return (node.cpu_free - request.cpu_milli) * index.max_gpu_milli + (
        node.free_milli - _taken_milli(request)
    ) * index.max_cpu_milli


def best_fit_walk(index: ClusterIndex, leaves: list[LeafKey] | None, request: Request) -> Iterator[NodeState]:
    """Placeable nodes by best-fit cost, then name, skipping nodes that cannot hold the request's CPU, memory
    or GPU amount. The cost is `fit_key` less a constant, so each whole-free bucket is already in cost order:
    merging the buckets with `need` or more free GPUs is exact, and the first node that fits is the best."""
    need = request.gpus
    cpu, mem, taken = request.cpu_milli, request.memory_mib, _taken_milli(request)
    nodes = index.nodes

    def fits(node: NodeState) -> bool:
        return node.cpu_free >= cpu and node.mem_free >= mem and node.free_milli_raw >= taken  # all must hold

    if leaves is not None:  # a few leaves: sort their nodes outright
        picked: list[NodeState] = []
        for leaf in leaves:
            b = index.leaves.get(leaf)
            if b is None:
                continue
            for k, names in b.by_free.items():
                if k >= need:
                    picked.extend(nodes[name] for name in names)
        picked.sort(key=lambda node: (best_fit_cost(node, request, index), node.name))
        yield from (node for node in picked if fits(node))
        return
    # each bucket's next entry and the rest of it (an iterator: a long bucket is a SortedNames, where an
    # index walks its chunks); entries are unique (one per node), so the heap never compares the iterators
    heads = []
    for k, entries in index.fit_buckets().items():
        if k >= need and entries:
            rest = iter(entries)
            heads.append((next(rest), rest))
    heapq.heapify(heads)
    while heads:
        entry, rest = heads[0]
        node = nodes[entry[1]]
        after = next(rest, None)
        if after is not None:
            heapq.heapreplace(heads, (after, rest))
        else:
            heapq.heappop(heads)
        if node.cpu_free >= cpu and node.mem_free >= mem and node.free_milli_raw >= taken:  # fits(), inlined
            yield node
