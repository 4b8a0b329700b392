"""Decisions: what `reserve` would answer for one request (a placement, a gang plan or slot claim, or a
denial), and `explain`'s per-node table. Deciding is read-only: it never holds, releases or expires anything.
"""

from __future__ import annotations

from gpuledger.core.books.books import Books
from gpuledger.core.model import (
    MILLI_PER_GPU,
    Denial,
    DeviceShare,
    Explanation,
    NodeScore,
    Placement,
    Reason,
    Request,
)
from gpuledger.core.placing.diagnosis import Diagnoser, describe
from gpuledger.core.placing.filters import Filters, dynamic, unplaceable_reason
from gpuledger.core.placing.gangs import Gangs, GroupPlan, SlotClaim
from gpuledger.core.placing.selection import Choice, Selector, placement
from gpuledger.core.plugins.plugin import Fit, ScoreContext
from gpuledger.core.plugins.registry import canonical_name, get_strategy


class Decider:
    """Routes a request to a single, pinned or gang decision under its strategy, or denies it."""

    def __init__(
        self, books: Books, filters: Filters, selector: Selector, diagnoser: Diagnoser, gangs: Gangs
    ) -> None:
        self.books = books
        self.filters = filters
        self.selector = selector
        self.diagnoser = diagnoser
        self.gangs = gangs

    def decide(self, req: Request, now: float):
        """A Placement, a GroupPlan, a SlotClaim or a Denial."""
        config = self.books.config
        try:
            name = canonical_name(req.strategy or config.default_strategy)
            strategy = get_strategy(name)
        except ValueError as err:
            return Denial(id=req.id, message=str(err), strategy=str(req.strategy or ""))
        bad = validate(req)
        if bad:
            return Denial(id=req.id, message=bad, strategy=name)
        ctx = self.filters.context(req)
        if req.group is not None and req.group.size > 1:
            return self.gangs.decide_group(req, strategy, name, ctx, now)
        if req.pinned is not None:
            return self.decide_pinned(req, name, ctx)
        gate = strategy.admit(req, ctx)
        if gate is not None:
            return Denial(
                id=req.id,
                message=(
                    f"no node fits {describe(req)} with strategy {name}: {gate.value} "
                    f"(priority {req.priority} may not leave less than {config.priority_headroom:.0%} "
                    f"of the cluster's GPU capacity free; priority >= 1 may)"
                ),
                by_reason=((gate, len(self.books.index.nodes)),),
                strategy=name,
            )
        choice = self.selector.select_soft_domain(req, strategy, ctx)
        if choice is None:
            counts, near, _ = self.diagnoser.diagnose(req, strategy, ctx)
            return self.diagnoser.denial(req, name, counts, near)
        return placement(req, choice, name)

    def decide_pinned(self, req: Request, strategy_name: str, ctx: ScoreContext) -> Placement | Denial:
        pin = req.pinned
        assert pin is not None

        def deny(reason: Reason, why: str) -> Denial:
            return Denial(
                id=req.id,
                message=(
                    f"explicit map (gpu-scheduling-map) {pin.node}:{list(pin.devices)} "
                    f"cannot be honoured: {why}"
                ),
                by_reason=((reason, 1),),
                strategy="explicit",
            )

        node = self.books.index.nodes.get(pin.node)
        if node is None:
            return deny(Reason.PINNED, f"node {pin.node} is unknown")
        if not pin.devices and req.needs_gpu:
            return deny(Reason.PINNED, "the map lists no devices")
        reason, taints = self.filters.static(node, req)
        if reason is not None:
            return deny(reason, f"node {pin.node}: {reason.value}")
        if not node.placeable:
            return deny(Reason.NOT_READY, f"node {pin.node} is not ready, cordoned or not GPU-schedulable")
        for d in pin.devices:
            p = node.pos.get(d)
            if p is None:
                return deny(
                    Reason.PINNED, f"device {d} does not exist on {pin.node} (it has {node.dev_index})"
                )
            if not node.dev_healthy[p]:
                return deny(Reason.PINNED, f"device {d} on {pin.node} is unhealthy")
        if node.cpu_free < req.cpu_milli:
            return deny(Reason.NOT_ENOUGH_CPU, f"{node.cpu_free}m cpu free, {req.cpu_milli}m requested")
        if node.mem_free < req.memory_mib:
            return deny(Reason.NOT_ENOUGH_MEMORY, f"{node.mem_free} MiB free, {req.memory_mib} MiB requested")
        if req.is_shared:
            d = pin.devices[0]
            p = node.pos[d]
            if node.dev_owner[p] is not None or node.dev_free_milli[p] < req.gpu_milli:
                return deny(Reason.PINNED, f"device {d} is taken ({node.dev_free_milli[p]}m free)")
            if req.gpu_memory_mib and node.dev_mem_total[p] and node.dev_free_mem[p] < req.gpu_memory_mib:
                return deny(Reason.PINNED, f"device {d} has {node.dev_free_mem[p]} MiB free")
            if node.dev_nshares[p] == 0 and node.whole_free < 1:
                return deny(
                    Reason.PINNED, f"{pin.node} has no GPU to spare (GPUs of unknown identity in use)"
                )
            fit = Fit(shares=(DeviceShare(d, req.gpu_milli, req.gpu_memory_mib),))
        else:
            taken = [d for d in pin.devices if not node.is_fully_free(node.pos[d])]
            if taken:
                return deny(Reason.PINNED, f"device(s) {taken} on {pin.node} are taken")
            if node.whole_free < len(set(pin.devices)):
                return deny(
                    Reason.PINNED,
                    f"{pin.node} has {node.whole_free} GPU(s) to spare (GPUs of unknown identity in use)",
                )
            fit = Fit(devices=tuple(sorted(set(pin.devices))))
        return placement(req, Choice(node, fit, 0.0, taints), "explicit")

    def explain(self, request: Request, with_scores: bool = True) -> Explanation:
        """The decision `reserve` would make now, with every node's score or reasons; reserves nothing.
        `with_scores=False` skips the per-node table (a dry run needs only the decision)."""
        books = self.books
        existing = books.reservations.get(request.id)
        if existing is not None:
            result: Placement | Denial = existing.placement
        else:
            decision = self.decide(request, books.last_now if books.last_now > float("-inf") else 0.0)
            if isinstance(decision, GroupPlan):
                result = self.gangs.group_placement(decision, request, 0, request.id, decision.deadline)
            elif isinstance(decision, SlotClaim):
                result = self.gangs.claim_placement(decision, request)
            else:
                result = decision
        if not with_scores:
            return Explanation(result=result)
        try:
            strategy = get_strategy(request.strategy or books.config.default_strategy)
        except ValueError:
            return Explanation(result=result)
        ctx = self.filters.context(request)
        scores = []
        for node in books.index.nodes.values():
            if not node.placeable:
                scores.append(NodeScore(node.name, None, (unplaceable_reason(node),)))
                continue
            reason, _ = self.filters.static(node, request)
            if reason is not None:
                scores.append(NodeScore(node.name, None, (reason,)))
                continue
            fit, reasons = dynamic(node, request, strategy, ctx)
            if reasons:
                scores.append(NodeScore(node.name, None, tuple(reasons)))
            else:
                scores.append(NodeScore(node.name, strategy.score(node, request, fit, ctx)))
        scores.sort(key=lambda s: (s.score is None, -(s.score or 0.0), s.node))
        return Explanation(result=result, scores=tuple(scores))


def validate(req: Request) -> str:
    """A message naming the bad field and what is accepted, or ''."""
    if req.gpus < 0:
        return f"request {req.id}: gpus={req.gpus}; accepted: an integer >= 0"
    if req.gpus > 0 and req.gpu_milli:
        return (
            f"request {req.id}: gpus={req.gpus} with gpu_milli={req.gpu_milli}; accepted: whole GPUs or a "
            "share of one GPU, not both"
        )
    if not 0 <= req.gpu_milli <= MILLI_PER_GPU:
        return f"request {req.id}: gpu_milli={req.gpu_milli}; accepted: 0..{MILLI_PER_GPU}"
    if req.gpu_memory_mib < 0 or req.cpu_milli < 0 or req.memory_mib < 0:
        return f"request {req.id}: negative resource request; accepted: values >= 0"
    if req.group is not None and req.group.size < 1:
        return f"request {req.id}: group {req.group.key} size={req.group.size}; accepted: >= 1"
    return ""
