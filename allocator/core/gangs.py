"""Gangs: a multi-pod group placed all-or-nothing over the leaf/spine topology, held slot by slot until its
pods claim them, and a missing slot re-placed near the group. Gangs only decide and commit: they never
release or expire a slot (the leases do).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from allocator.core.books import Books, GroupState, Reservation, slot_hid
from allocator.core.diagnosis import Diagnoser, describe
from allocator.core.filters import tolerated_gpu_taints
from allocator.core.inventory import Holding, LeafKey
from allocator.core.model import Denial, GroupSlot, Placement, Reason, Request, ReservationState, Taint
from allocator.core.selection import Choice, Selector, device_uuids, placement
from allocator.core.topology import plan_leaves


@dataclass
class GroupPlan:
    key: str
    slots: list[tuple[int, Choice]]
    strategy: str
    deadline: float


@dataclass
class SlotClaim:
    group: str
    slot: int
    new: Choice | None  # None = an unclaimed slot of the plan; else a new slot placed now


class Gangs:
    """Plans a new gang over the topology, or a claim of one of a known gang's slots, and commits either."""

    def __init__(self, books: Books, selector: Selector, diagnoser: Diagnoser):
        self.books = books
        self.selector = selector
        self.diagnoser = diagnoser

    def decide_group(self, req, strategy, name, ctx, now):
        books = self.books
        group = books.groups.get(req.group.key)
        if group is not None:
            return self.decide_claim(req, group, strategy, name, ctx)
        spec = req.group
        per_pod = req.gpus
        cap_limit = spec.max_nodes_per_leaf or spec.size
        if spec.max_gpus_per_leaf and per_pod:
            cap_limit = min(cap_limit, spec.max_gpus_per_leaf // per_pod)
        if cap_limit <= 0:
            return Denial(
                id=req.id,
                message=(
                    f"group {spec.key}: max_gpus_per_leaf={spec.max_gpus_per_leaf} cannot hold even one pod "
                    f"of {per_pod} GPU(s)"
                ),
                by_reason=((Reason.LEAF_CONSTRAINT, len(books.index.nodes)),),
                strategy=name,
            )
        topo = books.topology()
        spread = name == "distributed"
        exact: dict[LeafKey, list[Choice]] = {}

        def upper(leaf: LeafKey) -> int:
            b = books.index.leaves.get(leaf)
            if b is None:
                return 0
            n = sum(len(lst) for k, lst in b.by_free.items() if k >= per_pod) if per_pod else b.count
            return min(n, cap_limit)

        def exact_choices(leaf: LeafKey) -> list[Choice]:
            got = exact.get(leaf)
            if got is None:
                got = []
                b = books.index.leaves.get(leaf)
                if b is not None:
                    for k, names in b.by_free.items():
                        if k < per_pod:
                            continue
                        for nm in names:
                            c = self.selector.try_node(books.index.nodes[nm], req, strategy, ctx)
                            if c is not None:
                                got.append(c)
                got.sort(key=lambda c: (-c.score, c.node.name))
                exact[leaf] = got
            return got

        def attempt(leaves_allowed: set[LeafKey] | None):
            caps = {}
            for leaf in topo.order():
                if leaves_allowed is not None and leaf not in leaves_allowed:
                    continue
                caps[leaf] = min(len(exact[leaf]), cap_limit) if leaf in exact else upper(leaf)
            while True:
                plan = plan_leaves(topo, caps, spec.size, spread)
                if plan is None:
                    return None
                stale = [leaf for leaf, _ in plan if leaf not in exact]
                if not stale:
                    return plan
                for leaf in stale:
                    caps[leaf] = min(len(exact_choices(leaf)), cap_limit)

        domain = self.selector.domain_leaves(req.preferred_domain)
        plan = attempt(set(domain)) if domain else None
        if plan is None:
            plan = attempt(None)
        if plan is None:
            counts, near, fitting = self.diagnoser.diagnose(req, strategy, ctx)
            if fitting:
                counts[Reason.LEAF_CONSTRAINT] += fitting
            limits = []
            if spec.max_nodes_per_leaf:
                limits.append(f"max {spec.max_nodes_per_leaf} node(s) per leaf")
            if spec.max_gpus_per_leaf:
                limits.append(f"max {spec.max_gpus_per_leaf} GPU(s) per leaf")
            prefix = (
                f"no placement for group {spec.key}: {spec.size} pods x {describe(req)}, one pod per node"
                f"{' (' + ', '.join(limits) + ')' if limits else ''}, with strategy {name}; "
                f"{fitting} node(s) could take one pod"
            )
            return self.diagnoser.denial(req, name, counts, near, prefix=prefix)
        slots: list[tuple[int, Choice]] = []
        for leaf, n in plan:
            for choice in exact[leaf][:n]:
                slots.append((len(slots), choice))
        return GroupPlan(spec.key, slots, name, now + books.config.reservation_ttl_s)

    def group_placement(self, gp: GroupPlan, req: Request, slot: int, pid: str, deadline: float) -> Placement:
        plan = tuple(
            GroupSlot(
                i,
                c.node.name,
                c.fit.devices,
                device_uuids(c.node, [*c.fit.devices, *(s.device for s in c.fit.shares)]),
                c.fit.shares,
            )
            for i, c in gp.slots
        )
        choice = gp.slots[slot][1]
        p = placement(req, choice, gp.strategy, group=gp.key, slot=slot, group_plan=plan, group_deadline=deadline)
        return p

    def commit_group(self, gp: GroupPlan, req: Request, now: float) -> Placement:
        books = self.books
        first = self.group_placement(gp, req, 0, req.id, gp.deadline)
        group = GroupState(
            key=gp.key,
            slots={s.slot: s for s in first.group_plan},
            claims={},
            deadline=gp.deadline,
            cpu_milli=req.cpu_milli,
            memory_mib=req.memory_mib,
            strategy=gp.strategy,
        )
        books.groups[gp.key] = group
        group.slot_taints = {i: c.taints for i, c in gp.slots}
        for s in first.group_plan:
            hid = req.id if s.slot == 0 else slot_hid(gp.key, s.slot)
            group.claims[s.slot] = req.id if s.slot == 0 else None
            books.slot_of[hid] = (gp.key, s.slot)
            books.hold(Holding(hid, s.node, s.devices, s.shares, req.cpu_milli, req.memory_mib))
        books.reservations[req.id] = Reservation(first, ReservationState.RESERVED, now)
        return first

    def taints_for(self, group: GroupState, slot: int) -> tuple[Taint, ...]:
        if slot in group.slot_taints:
            return group.slot_taints[slot]
        node = self.books.index.nodes.get(group.slots[slot].node)
        if node is None:
            return ()
        return tolerated_gpu_taints(node, self.books.config.tolerated_gpu_taint_keys)

    def decide_claim(self, req, group: GroupState, strategy, name, ctx):
        free = sorted(s for s, who in group.claims.items() if who is None)
        if free:
            return SlotClaim(group.key, free[0], None)
        size = len(group.slots) if group.slots else req.group.size
        live = len([s for s in group.claims if group.claims[s] is not None])
        if live >= max(size, req.group.size):
            return Denial(
                id=req.id,
                message=(
                    f"group {group.key} already has {live} pod(s) placed in {live} slot(s); a new pod of the group "
                    "gets a slot when one of them is released"
                ),
                by_reason=((Reason.LEAF_CONSTRAINT, 1),),
                strategy=name,
            )
        # re-place one missing slot near the group: its leaves first, one pod per node, leaf limits kept
        nodes = self.books.index.nodes
        used_nodes = {s.node for s in group.slots.values()}
        leaf_count: Counter[LeafKey] = Counter()
        for s in group.slots.values():
            n = nodes.get(s.node)
            if n is not None:
                leaf_count[n.leaf_key] += 1
        spec = req.group
        blocked = set()
        for leaf, c in leaf_count.items():
            if spec.max_nodes_per_leaf and c >= spec.max_nodes_per_leaf:
                blocked.add(leaf)
            if spec.max_gpus_per_leaf and (c + 1) * req.gpus > spec.max_gpus_per_leaf:
                blocked.add(leaf)
        exclude = used_nodes | {n.name for n in nodes.values() if n.leaf_key in blocked}
        group_leaves = sorted(set(leaf_count) - blocked)
        select = self.selector.select
        choice = select(req, strategy, ctx, group_leaves, exclude) if group_leaves else None
        if choice is None:
            choice = select(req, strategy, ctx, None, exclude)
        if choice is None:
            counts, near, _ = self.diagnoser.diagnose(req, strategy, ctx, exclude)
            prefix = f"no node for a new pod of group {group.key}"
            return self.diagnoser.denial(req, name, counts, near, prefix=prefix)
        slot = next(i for i in range(len(group.slots) + 1) if i not in group.slots)
        return SlotClaim(group.key, slot, choice)

    def claim_placement(self, claim: SlotClaim, req: Request) -> Placement:
        group = self.books.groups[claim.group]
        if claim.new is not None:
            c = claim.new
            slot = GroupSlot(
                claim.slot,
                c.node.name,
                c.fit.devices,
                device_uuids(c.node, [*c.fit.devices, *(s.device for s in c.fit.shares)]),
                c.fit.shares,
            )
            plan = tuple(sorted([*group.slots.values(), slot], key=lambda s: s.slot))
            taints = c.taints
        else:
            slot = group.slots[claim.slot]
            plan = group.plan()
            taints = self.taints_for(group, claim.slot)
        return Placement(
            id=req.id,
            node=slot.node,
            devices=slot.devices,
            shares=slot.shares,
            uuids=slot.uuids,
            cpu_milli=group.cpu_milli,
            memory_mib=group.memory_mib,
            group=group.key,
            slot=claim.slot,
            strategy=group.strategy,
            tolerated_taints=taints,
            group_plan=plan,
            group_deadline=group.deadline,
        )

    def commit_claim(self, claim: SlotClaim, req: Request, now: float) -> Placement:
        books = self.books
        group = books.groups[claim.group]
        placed = self.claim_placement(claim, req)
        if claim.new is None:
            books.unhold(slot_hid(group.key, claim.slot))
            books.slot_of.pop(slot_hid(group.key, claim.slot), None)
        else:
            group.slots[claim.slot] = placed.group_plan[[s.slot for s in placed.group_plan].index(claim.slot)]
        group.claims[claim.slot] = req.id
        books.slot_of[req.id] = (group.key, claim.slot)
        books.hold(
            Holding(req.id, placed.node, placed.devices, placed.shares, group.cpu_milli, group.memory_mib)
        )
        books.reservations[req.id] = Reservation(placed, ReservationState.RESERVED, now)
        return placed
