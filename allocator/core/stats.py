"""Totals of the ledger per leaf, per spine and over the cluster (capacity, use, fragmentation) for metrics
and dashboards. Computed on demand from the books, which it only reads; never on the placement path.
"""

from __future__ import annotations

from dataclasses import dataclass

from allocator.core.books import Books
from allocator.core.model import MILLI_PER_GPU
from allocator.core.node_state import LeafKey


@dataclass(frozen=True)
class DomainStats:
    """Totals of one leaf or spine."""

    spine: str
    leaf: str  # "" for a spine
    nodes: int
    gpus: int  # healthy devices on placeable nodes
    milli_total: int
    milli_free: int
    whole_free: int

    @property
    def utilization(self) -> float:
        return 1.0 - self.milli_free / self.milli_total if self.milli_total else 0.0

    @property
    def fragmentation(self) -> float:
        """Share of free capacity that no whole-GPU request can use (free milli outside whole-free GPUs)."""
        if not self.milli_free:
            return 0.0
        return max(0.0, 1.0 - self.whole_free * MILLI_PER_GPU / self.milli_free)


@dataclass(frozen=True)
class LedgerStats:
    nodes: int
    placeable_nodes: int
    gpus_total: int  # devices on all nodes
    gpus_healthy: int
    milli_total: int  # healthy devices on placeable nodes
    milli_allocated: int
    whole_free: int
    reservations_pending: int
    reservations_confirmed: int
    groups: int
    unclaimed_slots: int
    leaves: tuple[DomainStats, ...] = ()
    spines: tuple[DomainStats, ...] = ()
    conflicts: int = 0  # stored pods holding a placement they do not own (Ledger.conflicts)
    # what the nodes' agents said against the ledger (allocator.core.truth): placements holding the kubelet's
    # devices instead of their own, placements whose devices the kubelet says another pod holds, and pending
    # reservations moved off such devices (since the ledger started; the others are current)
    device_corrections: int = 0
    device_conflicts: int = 0
    devices_moved: int = 0

    @property
    def fragmentation(self) -> float:
        free = self.milli_total - self.milli_allocated
        return max(0.0, 1.0 - self.whole_free * MILLI_PER_GPU / free) if free else 0.0

    def as_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k not in ("leaves", "spines")}
        d["fragmentation"] = self.fragmentation
        for name in ("leaves", "spines"):
            d[name] = [
                {**s.__dict__, "utilization": s.utilization, "fragmentation": s.fragmentation}
                for s in getattr(self, name)
            ]
        return d


def ledger_stats(books: Books) -> LedgerStats:
    leaves: dict[LeafKey, list[int]] = {}
    gpus_total = gpus_healthy = placeable = 0
    for n in books.index.nodes.values():
        gpus_total += len(n.dev_index)
        healthy = sum(n.dev_healthy)
        gpus_healthy += healthy
        if not n.placeable:
            continue
        placeable += 1
        acc = leaves.setdefault(n.leaf_key, [0, 0, 0, 0, 0])
        acc[0] += 1
        acc[1] += healthy
        acc[2] += n.total_milli
        acc[3] += n.free_milli
        acc[4] += n.whole_free
    leaf_stats = []
    spine_acc: dict[str, list[int]] = {}
    for (spine, leaf), (cnt, gpus, tot, free, whole) in sorted(leaves.items()):
        leaf_stats.append(DomainStats(spine, leaf, cnt, gpus, tot, free, whole))
        acc = spine_acc.setdefault(spine, [0, 0, 0, 0, 0])
        for i, v in enumerate((cnt, gpus, tot, free, whole)):
            acc[i] += v
    spine_stats = tuple(DomainStats(s, "", *v) for s, v in sorted(spine_acc.items()))
    milli_total = sum(s.milli_total for s in leaf_stats)
    milli_free = sum(s.milli_free for s in leaf_stats)
    reservations = books.reservations
    pending = len(books.pending)
    return LedgerStats(
        nodes=len(books.index.nodes),
        placeable_nodes=placeable,
        gpus_total=gpus_total,
        gpus_healthy=gpus_healthy,
        milli_total=milli_total,
        milli_allocated=milli_total - milli_free,
        whole_free=sum(s.whole_free for s in leaf_stats),
        reservations_pending=pending,
        reservations_confirmed=len(reservations) - pending,
        groups=len(books.groups),
        unclaimed_slots=sum(1 for g in books.groups.values() for who in g.claims.values() if who is None),
        leaves=tuple(leaf_stats),
        spines=spine_stats,
        conflicts=len(books.claims) - len(books.owner_of),
        devices_moved=books.pending_moved,
    )
