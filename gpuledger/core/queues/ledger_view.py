"""What the queues read of the ledger, and the one question the preemption planner asks it.

Read through the ledger's public surface only (`get`, `index`, `explain`): what a workload's reservations
hold and where, the cluster's GPU capacity by product, and `decide_without`: the decision `reserve` would
make for a request if some workloads held nothing. That last one lifts their holdings off their nodes' free
counters (the cluster index re-files each node), asks the ledger's own decision, and puts every holding back
as it was before returning, so the answer is the ledger's (its gang windows, leaf rules, products, filters)
and the ledger is left as it was. Nothing else may run on the ledger meanwhile: like every ledger call, it
runs to its end on the ledger's one thread.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Protocol

from gpuledger.core.books.books import slot_hid
from gpuledger.core.model import MILLI_PER_GPU, Denial, Explanation, Placement, Request
from gpuledger.core.nodes.inventory import ClusterIndex
from gpuledger.core.nodes.node_state import Holding, NodeState
from gpuledger.core.queues.quotas import Capacity, ProductCapacity, Use


class Ledger(Protocol):
    """What the view reads of gpuledger.core.ledger.Ledger (named by its surface, not imported: the ledger
    holds preemption plans, whose planner reads it through this view)."""

    @property
    def index(self) -> ClusterIndex: ...

    def get(self, id: str) -> Placement | None: ...

    def explain(self, request: Request, with_scores: bool = True) -> Explanation: ...


def holding_milli(h: Holding) -> int:
    return (len(h.devices) + h.unknown_gpus) * MILLI_PER_GPU + sum(s.milli for s in h.shares)


class LedgerView:
    """A read-only view of one ledger for quotas, fair share and preemption plans."""

    def __init__(self, ledger: Ledger):
        self.ledger = ledger

    def product(self, node: str) -> str:
        state = self.ledger.index.nodes.get(node)
        return state.info.product if state is not None else ""

    def leaf(self, node: str) -> str:
        """The node's leaf ("" for a node the ledger does not know)."""
        state = self.ledger.index.nodes.get(node)
        return state.info.leaf if state is not None else ""

    def holdings(self, reservation_ids: Iterable[str]) -> list[Holding]:
        """What the reservations hold, and, for a gang, its slots no pod has claimed yet (they go when its
        last pod goes): everything evicting the workload whole frees."""
        nodes = self.ledger.index.nodes
        out: dict[str, Holding] = {}
        for rid in reservation_ids:
            placement = self.ledger.get(rid)
            if placement is None:
                continue
            state = nodes.get(placement.node)
            if state is not None and rid in state.holders:
                out[rid] = state.holders[rid]
            if placement.group is not None:
                for s in placement.group_plan:
                    hid = slot_hid(placement.group, s.slot)
                    slot_state = nodes.get(s.node)
                    if slot_state is not None and hid in slot_state.holders:
                        out[hid] = slot_state.holders[hid]
        return [out[k] for k in sorted(out)]

    def nodes_of(self, reservation_ids: Iterable[str]) -> dict[str, int]:
        """Node -> milli-GPUs the reservations hold there (with a gang's unclaimed slots, as `holdings`):
        what freeing them gives each node, read from the placements (a pod's own, without its node's
        holders, unless it is a gang's)."""
        out: dict[str, int] = {}
        for rid in reservation_ids:
            placement = self.ledger.get(rid)
            if placement is None:
                continue
            if placement.group is not None:
                for h in self.holdings([rid]):
                    out[h.node] = out.get(h.node, 0) + holding_milli(h)
                continue
            milli = len(placement.devices) * MILLI_PER_GPU + sum(x.milli for x in placement.shares)
            out[placement.node] = out.get(placement.node, 0) + milli
        return out

    def use_of_holdings(self, holdings: Iterable[Holding]) -> Use:
        return Use.of((self.product(h.node), holding_milli(h), h.cpu_milli, h.memory_mib) for h in holdings)

    def use_of(self, reservation_ids: Iterable[str]) -> Use:
        return self.use_of_holdings(self.holdings(reservation_ids))

    def use_of_placement(self, placement: Placement) -> Use:
        """What a placement would hold: every slot of a gang's plan, else its one node."""
        if placement.group_plan:
            return Use.of(
                (
                    self.product(s.node),
                    len(s.devices) * MILLI_PER_GPU + sum(x.milli for x in s.shares),
                    placement.cpu_milli,
                    placement.memory_mib,
                )
                for s in placement.group_plan
            )
        milli = len(placement.devices) * MILLI_PER_GPU + sum(x.milli for x in placement.shares)
        return Use.of([(self.product(placement.node), milli, placement.cpu_milli, placement.memory_mib)])

    def capacity(self) -> Capacity:
        """Every node with GPUs, summed by product (a walk of every node: callers keep it for a cycle)."""
        sums: dict[str, list[int]] = {}
        for state in self.ledger.index.nodes.values():
            if not state.dev_index:
                continue
            s = sums.setdefault(state.info.product, [0, 0, 0, 0])
            s[0] += state.total_milli
            s[1] += state.free_milli if state.placeable else 0
            s[2] += state.info.cpu_milli
            s[3] += state.info.memory_mib
        return Capacity({p: ProductCapacity(*v) for p, v in sorted(sums.items())})

    def node_room(self, node: str) -> tuple[str, int, int]:
        """(GPU product, whole GPUs free, milli-GPUs free) of a node; none free where it is not placeable."""
        state = self.ledger.index.nodes.get(node)
        if state is None:
            return "", 0, 0
        if not state.placeable:
            return state.info.product, 0, 0
        return state.info.product, state.whole_free, state.free_milli

    def decide_without(self, request: Request, holdings: Sequence[Holding]) -> Placement | Denial:
        """The decision `reserve` would make for `request` if `holdings` held nothing; changes nothing."""
        index = self.ledger.index
        lifted: list[tuple[NodeState, Holding]] = []
        try:
            for h in holdings:
                state = index.nodes.get(h.node)
                if state is not None and state.holders.get(h.id) is h:
                    index.change(state, state.remove, h.id)
                    lifted.append((state, h))
            return self.ledger.explain(request, with_scores=False).result
        finally:
            for state, h in reversed(lifted):
                index.change(state, state.apply, h)
