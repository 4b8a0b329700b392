"""The preemption pass: which waiting workloads may take GPUs from running ones, planned and held.

After placing what fits, the ledger looks at the head of each line of waiting pods, in the queues' fair order,
and asks the preemption planner (gpuledger.core.queues.preemption) for a plan for each: minimal, proven
against the ledger's own decision, within the PodDisruptionBudgets less the evictions the held plans still
owe. Each plan found is held (gpuledger.core.passes.held_plans), its nodes kept for its preemptor. A
workload on a node a plan keeps is no victim of another (one plan a node).

Planning reads every running workload, so not on every event: a head that found no plan is not tried again
until something changed and `replan_s` passed (time is an input). The same reading answers `explain`'s
question of what a request that would wait could preempt (`words`).
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import islice, repeat

from gpuledger.core.books.books import Books
from gpuledger.core.books.claims import Claims
from gpuledger.core.model import Denial, Placement, Request
from gpuledger.core.passes.held_plans import HeldPlan, HeldPlans
from gpuledger.core.queues.current_gate import CurrentGate
from gpuledger.core.queues.ledger_view import LedgerView
from gpuledger.core.queues.preemption import NoPlan, Plan, Planner, Preemptor, describe_plan
from gpuledger.core.queues.queue_book import QueueBook
from gpuledger.core.queues.waiting import Waiter, WaitingLine

REPLAN_S = 5.0  # a waiting workload that found no preemption plan is tried again after this long at the least
PLAN_LOOK_AHEAD = 16  # waiters of one line looked at for the first that may preempt, at most
NO_PLAN_KEPT = 4096  # heads remembered as having found no plan, at most (the oldest forgotten first)


class PreemptionPass:
    """Plans and holds preemptions for the heads of the line; remembers who found none since what change."""

    def __init__(
        self,
        books: Books,
        claims: Claims,
        queues: QueueBook,
        plans: HeldPlans,
        line: WaitingLine,
        view: LedgerView,
        gate: CurrentGate,
    ):
        self._books = books
        self._claims = claims
        self._queues = queues
        self._plans = plans
        self._line = line
        self._view = view  # what the planner reads of the ledger
        self._gate = gate  # the queues' gate as of the books' latest change
        self._changes = 0  # moves with every change the cluster or a caller makes (the memo below reads it)
        # ticket id -> (`_changes`, time) when it last found no plan: tried again once something changed
        # and `replan_s` passed (a pass reads every running workload: not on every event)
        self._no_plan: dict[str, tuple[int, float]] = {}
        self.replan_s = REPLAN_S

    def changed(self) -> None:
        """The cluster or a caller changed the ledger: a head that found no plan may find one now."""
        self._changes += 1

    def eviction_refused(self, plan_id: str, namespace: str, name: str, now: float) -> None:
        """The API server refused to evict a victim of plan `plan_id`: the plan is dropped, its victim left
        out of plans for a while, and every head planned again at the next pass."""
        self._plans.refused_eviction(plan_id, namespace, name, now)
        self._changes += 1
        self._no_plan.clear()

    def plan(self, now: float, most: int = 8) -> list[HeldPlan]:
        """Plan preemptions for the heads of the line that do not fit now, in the fair order (at most `most`
        tried a pass); hold each plan found. The new plans; none while no GPUQueue exists."""
        book, plans = self._queues, self._plans
        queues = book.queues
        gate = self._gate.get()
        if queues is None or gate is None:
            return []
        heads = [h for h in map(self._plan_head, self._line.undecided_by_line(), repeat(now)) if h]
        if not heads:
            return []
        heads.sort(key=lambda h: (gate.key(h.request), h.rank))
        excluded = plans.excluded(now)
        running = book.running(excluded)
        excluded |= self._on_kept_nodes()
        by_key = {r.key: r for r in running}
        allowances = self._allowances_left()
        usage, capacity = book.usage(), book.capacity()
        made: list[HeldPlan] = []
        for head in heads[:most]:
            facts = book.pods[head.key]
            preemptor = self._preemptor(head, facts.never)
            planner = Planner(queues, usage, capacity, self._view)
            found = planner.plan(preemptor, [r for r in running if r.key not in excluded], allowances, now)
            if isinstance(found, Plan) and found.victims:
                held = plans.hold(found, facts, head.id, by_key)
                made.append(held)
                excluded |= {v.workload.key for v in found.victims} | self._on_kept_nodes()
                for v in found.victims:
                    for budget, n in v.workload.budgets:
                        allowances[budget] = allowances.get(budget, 0) - n
            else:
                self._no_plan[head.id] = (self._changes, now)
        while len(self._no_plan) > NO_PLAN_KEPT:
            del self._no_plan[next(iter(self._no_plan))]
        return made

    def words(self, request: Request, result: Placement | Denial, now: float) -> str:
        """For a request that would wait (its queue's refusal, or a denial for now), the preemption it could
        make or why none, in words; "" for one that would be placed or denied for what it asks."""
        book, gate = self._queues, self._gate.get()
        if gate is None or book.queues is None:
            return ""
        refusal = gate.refusal(request) if isinstance(result, Placement) else None
        if isinstance(result, Placement) and refusal is None:
            return ""
        if isinstance(result, Denial) and (not result.by_reason or not self._line.could_fit(request)):
            return ""  # it would not wait: denied for what it asks
        key = f"{request.namespace or 'default'}/{request.name}" if request.name else request.id
        facts = book.pods.get(key)
        group = request.group
        who = Preemptor(
            group.key if group is not None and group.size > 1 else key,
            book.queue_of(request.namespace) or book.queues.default,
            request,
            facts is not None and facts.never,
        )
        excluded = self._plans.excluded(now)
        running = book.running(excluded)
        excluded |= self._on_kept_nodes()
        planner = Planner(book.queues, book.usage(), book.capacity(), self._view)
        candidates = [r for r in running if r.key not in excluded]
        found: Plan | NoPlan = planner.plan(who, candidates, self._allowances_left(), now)
        words = describe_plan(found)
        return f"{refusal}; {words}" if refusal else words

    def _plan_head(self, line: Iterator[Waiter], now: float) -> Waiter | None:
        """The first waiter of a line to plan a preemption for, looking at most PLAN_LOOK_AHEAD deep past
        `preemptionPolicy: Never` pods (as in Kubernetes, a pod that may preempt goes before a Never pod
        ahead of it). None while one of the line holds a plan (the line is served), or once one that may
        preempt found no plan and nothing changed since: a line's pods share shape, namespace and so queue,
        the same answer for all."""
        plans, pods = self._plans.plans, self._queues.pods
        for w in islice(line, PLAN_LOOK_AHEAD):
            if w.id in plans:
                return None
            facts = pods.get(w.key)
            if facts is None or facts.never:
                continue
            return w if self._may_plan(w.id, now) else None
        return None

    def _may_plan(self, wid: str, now: float) -> bool:
        last = self._no_plan.get(wid)
        return last is None or (last[0] != self._changes and now - last[1] >= self.replan_s)

    def _on_kept_nodes(self) -> set[str]:
        """The workloads holding GPUs on a node a plan keeps (a gang by its key, a pod by its own): they are
        no victims of another plan (one plan a node, so its victims' GPUs go to its preemptor alone)."""
        books, claims = self._books, self._claims
        out: set[str] = set()
        for node in self._plans.kept_nodes():
            for hid in books.node_holders.get(node, ()):
                res = books.reservations.get(hid)
                if res is not None:
                    owner = claims.owner_of(hid)
                    group = res.placement.group
                    out.add(group if group is not None else owner.key if owner is not None else hid)
                elif hid in books.slot_of:
                    out.add(books.slot_of[hid][0])
        return out

    def _preemptor(self, head: Waiter, never: bool) -> Preemptor:
        req = head.request
        key = req.group.key if req.group is not None and req.group.size > 1 else head.key
        return Preemptor(key, self._queues.queue_of(head.namespace) or "", req, never)

    def _allowances_left(self) -> dict[str, int]:
        """Each PodDisruptionBudget's allowance less the victims the held plans still have to evict."""
        book = self._queues
        allowances = book.allowances()
        for plan in self._plans.plans.values():
            for _, pod in plan.present(book.pods):
                facts = book.pods.get(f"{pod[0]}/{pod[1]}")
                for budget in book.budgets.values():
                    if facts is not None and budget.covers(facts):
                        allowances[budget.key] = allowances.get(budget.key, 0) - 1
        return allowances
