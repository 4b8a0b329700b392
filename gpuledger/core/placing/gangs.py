"""Gangs: a multi-pod group placed all-or-nothing over the leaf/spine topology, held slot by slot until its
pods claim them, and a missing slot re-placed near the group. Gangs only decide and commit: they never
release or expire a slot (the leases do).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from gpuledger.core.books.books import Books, GroupState, slot_hid
from gpuledger.core.books.group_slots import ClaimTable
from gpuledger.core.books.topology import plan_leaves
from gpuledger.core.model import (
    Denial,
    GroupSlot,
    GroupSpec,
    Placement,
    Reason,
    Request,
    Taint,
)
from gpuledger.core.nodes.node_state import Holding, LeafKey
from gpuledger.core.placing.diagnosis import Diagnoser, describe
from gpuledger.core.placing.filters import dynamic, tolerated_gpu_taints
from gpuledger.core.placing.leaf_caps import LeafCaps
from gpuledger.core.placing.selection import Choice, Selector, device_uuids, placement
from gpuledger.names import GPU_COUNT, GPU_MEMORY, GPU_MILLI, PODGROUP_GANG_PREFIX


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
        self.leaf_caps = LeafCaps(books.index)  # per gang shape, each leaf's bound, kept current

    def decide_group(self, req, strategy, name, ctx, now):
        """A claim of a known gang's slot; else a new gang's plan, all-or-nothing over the leaves (in the
        preferred domain when one is named and can hold it), or a Denial."""
        group = self.books.groups.get(req.group.key)
        if group is not None:
            return self.decide_claim(req, group, strategy, name, ctx)
        spec = req.group
        # the leaf rules count nodes (max_nodes_per_leaf) and GPUs (max_gpus_per_leaf); pods of the gang may
        # share a node whenever its free devices hold more than one of them
        node_limit = spec.max_nodes_per_leaf or spec.size
        pod_limit = spec.size
        if spec.max_gpus_per_leaf and req.gpus:
            pod_limit = min(pod_limit, spec.max_gpus_per_leaf // req.gpus)
        if pod_limit <= 0:
            return Denial(
                id=req.id,
                message=(
                    f"group {spec.key}: max_gpus_per_leaf={spec.max_gpus_per_leaf} cannot hold even one pod "
                    f"of {req.gpus} GPU(s)"
                ),
                by_reason=((Reason.LEAF_CONSTRAINT, len(self.books.index.nodes)),),
                strategy=name,
            )
        spread = name == "distributed"
        planner = _LeafPlanner(self, req, strategy, ctx, spec.size, node_limit, pod_limit, spread)
        domain = self.selector.domain_leaves(req.preferred_domain)
        plan = planner.attempt(set(domain)) if domain else None
        if plan is None:
            plan = planner.attempt(None)
        if plan is None:
            return self._group_denial(req, spec, strategy, name, ctx)
        return GroupPlan(spec.key, planner.slots(plan), name, now + self.books.config.reservation_ttl_s)

    def _group_denial(self, req: Request, spec: GroupSpec, strategy, name: str, ctx) -> Denial:
        """No plan: why each node cannot take a pod, and the leaf rules when nodes could take one each."""
        counts, near, fitting = self.diagnoser.diagnose(req, strategy, ctx)
        if fitting:
            counts[Reason.LEAF_CONSTRAINT] += fitting
        limits = []
        if spec.max_nodes_per_leaf:
            limits.append(f"max {spec.max_nodes_per_leaf} node(s) per leaf")
        if spec.max_gpus_per_leaf:
            limits.append(f"max {spec.max_gpus_per_leaf} GPU(s) per leaf")
        prefix = (
            f"no placement for group {spec.key}: {spec.size} pods x {describe(req)}"
            f"{' (' + ', '.join(limits) + ')' if limits else ''}, with strategy {name}; "
            f"{fitting} node(s) could take one pod"
        )
        return self.diagnoser.denial(req, name, counts, near, prefix=prefix)

    def node_fits(self, node, req: Request, strategy, ctx, limit: int) -> list[Choice]:
        """The successive places up to `limit` pods of one gang take on one node (its first pod's choice,
        then each next one with the ones before it held). Holds are tried on the node and undone at once."""
        first = self.selector.try_node(node, req, strategy, ctx)
        if first is None:
            return []
        out = [first]
        probes: list[str] = []
        try:
            while len(out) < limit:
                last = out[-1]
                hid = f"{req.id}#probe{len(out)}"
                node.apply(
                    Holding(hid, node.name, last.fit.devices, last.fit.shares, req.cpu_milli, req.memory_mib)
                )
                probes.append(hid)
                fit, reasons = dynamic(node, req, strategy, ctx)
                if reasons:
                    break
                out.append(Choice(node, fit, strategy.score(node, req, fit, ctx), first.taints))
        finally:
            for hid in reversed(probes):
                node.remove(hid)
        return out

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
        p = placement(
            req, choice, gp.strategy, group=gp.key, slot=slot, group_plan=plan, group_deadline=deadline
        )
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
            slot_taints={i: c.taints for i, c in gp.slots},
        )
        books.record_group(group)
        for s in first.group_plan:
            hid = req.id if s.slot == 0 else slot_hid(gp.key, s.slot)
            books.record_slot_claim(group, s.slot, req.id if s.slot == 0 else None)
            books.record_slot_holder(hid, gp.key, s.slot)
            books.hold(Holding(hid, s.node, s.devices, s.shares, req.cpu_milli, req.memory_mib))
        books.record_reserved(first, now)
        return first

    def taints_for(self, group: GroupState, slot: int) -> tuple[Taint, ...]:
        if slot in group.slot_taints:
            return group.slot_taints[slot]
        node = self.books.index.nodes.get(group.slots[slot].node)
        if node is None:
            return ()
        return tolerated_gpu_taints(node, self.books.config.tolerated_gpu_taint_keys)

    def decide_claim(self, req, group: GroupState, strategy, name, ctx):
        differs = shape_mismatch(group, req)
        if differs:
            return Denial(id=req.id, message=differs, strategy=name)
        claims: ClaimTable = group.claims  # type: ignore[assignment]  # (GroupState keeps its claims so)
        free = claims.first_unclaimed()
        if free is not None:
            return SlotClaim(group.key, free, None)
        size = len(group.slots) if group.slots else req.group.size
        live = claims.claimed()
        # a PodGroup's pods beyond minCount are kube-scheduler's to schedule once the gang is: each takes a
        # new slot near the gang; any other gang is as big as its owner says
        if live >= max(size, req.group.size) and not group.key.startswith(PODGROUP_GANG_PREFIX):
            return Denial(
                id=req.id,
                message=(
                    f"group {group.key} already has {live} pod(s) placed in {live} slot(s); a new pod of the "
                    "group "
                    "gets a slot when one of them is released"
                ),
                by_reason=((Reason.LEAF_CONSTRAINT, 1),),
                strategy=name,
            )
        # re-place one missing slot near the group: its leaves first, leaf limits (nodes, GPUs per leaf) kept
        nodes = self.books.index.nodes
        leaf_nodes: dict[LeafKey, set[str]] = {}
        leaf_gpus: Counter[LeafKey] = Counter()
        for s in group.slots.values():
            n = nodes.get(s.node)
            if n is not None:
                leaf_nodes.setdefault(n.leaf_key, set()).add(s.node)
                leaf_gpus[n.leaf_key] += len(s.devices)
        spec = req.group
        exclude = set()
        for n in nodes.values():
            used = leaf_nodes.get(n.leaf_key, set())
            gpus_full = spec.max_gpus_per_leaf and leaf_gpus[n.leaf_key] + req.gpus > spec.max_gpus_per_leaf
            nodes_full = (
                spec.max_nodes_per_leaf and len(used) >= spec.max_nodes_per_leaf and n.name not in used
            )
            if gpus_full or nodes_full:
                exclude.add(n.name)
        group_leaves = sorted(leaf_nodes)
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
            books.forget_slot_holder(slot_hid(group.key, claim.slot))
        else:
            books.record_group_slot(
                group, placed.group_plan[[s.slot for s in placed.group_plan].index(claim.slot)]
            )
        books.record_slot_claim(group, claim.slot, req.id)
        books.record_slot_holder(req.id, group.key, claim.slot)
        books.hold(
            Holding(req.id, placed.node, placed.devices, placed.shares, group.cpu_milli, group.memory_mib)
        )
        books.record_reserved(placed, now)
        return placed


class _LeafPlanner:
    """One new gang's plan over the leaves: each leaf counted by its bound (LeafCaps) until a plan uses it,
    then by the exact pods its nodes take (Gangs.node_fits), so only the leaves a plan picks are tried."""

    def __init__(
        self,
        gangs: Gangs,
        req: Request,
        strategy,
        ctx,
        size: int,
        node_limit: int,
        pod_limit: int,
        spread: bool,
    ) -> None:
        self.gangs, self.req, self.strategy, self.ctx = gangs, req, strategy, ctx
        self.size, self.node_limit, self.pod_limit, self.spread = size, node_limit, pod_limit, spread
        self.topo = gangs.books.topology()
        # leaf -> per node (best first) the pods it can take
        self.exact: dict[LeafKey, list[list[Choice]]] = {}

    def attempt(self, leaves_allowed: set[LeafKey] | None) -> list[tuple[LeafKey, int]] | None:
        """(leaf, pods) for the whole gang over the allowed leaves (all when None); None if none fits."""
        topo, req = self.topo, self.req
        caps, spines = self.gangs.leaf_caps.bounds(topo, req.gpus, self.node_limit, self.pod_limit)
        if leaves_allowed is not None:
            caps = {leaf: cap for leaf, cap in caps.items() if leaf in leaves_allowed}
            spines = {s: sum(caps.get(leaf, 0) for leaf in topo.leaves_of[s]) for s in topo.spines}
        for leaf in self.exact:
            if leaf in caps:
                self._exact_cap(leaf, caps, spines)
        while True:
            plan = plan_leaves(topo, caps, self.size, self.spread, req.latency_sensitive, spines)
            if plan is None:
                return None
            stale = [leaf for leaf, _ in plan if leaf not in self.exact]
            if not stale:
                return plan
            for leaf in stale:
                self._try_nodes(leaf)
                self._exact_cap(leaf, caps, spines)

    def slots(self, plan: list[tuple[LeafKey, int]]) -> list[tuple[int, Choice]]:
        """The plan's pods, numbered, each on its node: dealt over each leaf's best nodes."""
        slots: list[tuple[int, Choice]] = []
        for leaf, n in plan:
            for choice in deal(self.exact[leaf][: self.node_limit], n, self.spread):
                slots.append((len(slots), choice))
        return slots

    def _try_nodes(self, leaf: LeafKey) -> None:
        """The exact places each node of `leaf` has for the gang's pods, best node first."""
        if leaf in self.exact:
            return
        index, req, per_pod = self.gangs.books.index, self.req, self.req.gpus
        got = []
        b = index.leaves.get(leaf)
        if b is not None:
            for k, names in b.by_free.items():
                if k < per_pod:
                    continue
                per_node = min(k // per_pod, self.pod_limit) if per_pod else 1  # a shared pod: one per node
                for nm in names:
                    fits = self.gangs.node_fits(index.nodes[nm], req, self.strategy, self.ctx, per_node)
                    if fits:
                        got.append(fits)
        got.sort(key=lambda fits: (-fits[0].score, fits[0].node.name))
        self.exact[leaf] = got

    def _exact_cap(self, leaf: LeafKey, caps: dict[LeafKey, int], spines: dict[str, int]) -> None:
        """`leaf`'s bound replaced by the pods its nodes take, and its spine's sum with it."""
        new = min(sum(len(fits) for fits in self.exact[leaf][: self.node_limit]), self.pod_limit)
        spines[leaf[0]] += new - caps[leaf]
        caps[leaf] = new


def pod_shape(gpus: int, shares: tuple[tuple[int, int], ...]) -> str:
    """One gang pod's GPUs, (whole GPUs, ((milli, memory MiB) of each share)), in the words of a denial."""
    if shares:
        return " + ".join(f"a share of {milli} milli-GPU and {mem} MiB GPU memory" for milli, mem in shares)
    return f"{gpus} whole GPU(s)"


def shape_mismatch(group: GroupState, req: Request) -> str:
    """Why `req` cannot take a slot of `group` ('' when it can): every slot of a gang was planned for one
    pod shape (whole GPUs per pod, or one share's milli/memory), so a pod asking for another would be handed
    a slot of the wrong size."""
    if not group.slots:  # restored from a pod that could not keep its place (counted instead): no shape
        return ""
    first = group.plan()[0]
    have = (len(first.devices), tuple((s.milli, s.memory_mib) for s in first.shares))
    want = (req.gpus, ((req.gpu_milli, req.gpu_memory_mib),) if req.is_shared else ())
    if have == want:
        return ""
    if not have[1] and not want[1]:  # the count comes from gpu-count or the containers' GPU limits
        what, accepted = f"{GPU_COUNT}={req.gpus}", f"{have[0]}, the group's GPU count per pod"
    elif len(have[1]) == 1 and want[1]:
        ((milli, memory),) = have[1]
        if milli != req.gpu_milli:
            what, accepted = f"{GPU_MILLI}={req.gpu_milli}", f"{milli}, the group's share per pod"
        else:
            what, accepted = f"{GPU_MEMORY}={req.gpu_memory_mib}MiB", f"{memory}MiB, the group's per pod"
    else:  # whole GPUs against a share
        what = f"{GPU_COUNT}={req.gpus}, {GPU_MILLI}={req.gpu_milli}, {GPU_MEMORY}={req.gpu_memory_mib}MiB"
        accepted = f"{pod_shape(*have)} per pod, as the group's other pods"
    return (
        f"group {group.key}: {what} differs from the group's: its slots were planned for {pod_shape(*have)} "
        f"per pod and this pod asks for {pod_shape(*want)}; accepted: {accepted}"
    )


def deal(nodes: list[list[Choice]], n: int, spread: bool) -> list[Choice]:
    """`n` pods of a gang over one leaf's nodes (best first, each with the places it has for the gang's pods):
    packed (each node filled before the next: fewest nodes) or, for `distributed`, one pod per node in
    turn."""
    if not spread:
        return [c for fits in nodes for c in fits][:n]
    out: list[Choice] = []
    depth = 0
    while len(out) < n and any(len(fits) > depth for fits in nodes):
        out += [fits[depth] for fits in nodes if len(fits) > depth][: n - len(out)]
        depth += 1
    return out
