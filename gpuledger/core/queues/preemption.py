"""Preemption plans: which running workloads a waiting one may take GPUs back from, decided whole before any
eviction, proven against the ledger's exact topology, and minimal.

A waiting workload (the preemptor) that does not fit the free GPUs may take GPUs back by three rules:
- reclaim: from a queue that borrows (uses above its quota) GPUs the preemptor's queue lent, while the
  preemptor's queue stays within its own quota once it runs. In a two-level tree the rule is read where the
  two queues' branches meet: two teams of one organisation, or two organisations.
- priority: from lower-priority work of its own queue, where the queue borrows no more than before.
- critical: a `critical` (or higher) workload, where its queue allows it, from lower priority in other queues.
Never a victim: a workload younger than its queue's minimum run time, one whose PodDisruptionBudget would be
broken, and work of `critical` priority or above except for strictly higher priority. A preemptor with
`preemptionPolicy: Never` waits. Gangs are victims whole (a `Running` is a whole workload).

The plan is found in the ledger, not estimated. Candidates come in rank order (reclaimed before preempted
before critical, lower priority first, the youngest first), each adding what it frees to the room of its
nodes; a node with room for one more pod of the preemptor adds the candidates that made it to the line of
victims. The shortest prefix of that line with which the ledger would place the preemptor
(`LedgerView.decide_without`: its gang window, leaf rules, product, filters) and the quotas admit it is
found, then every victim the placement does not need is dropped, one at a time, each drop checked by the
ledger again: removing any victim left makes the preemptor not fit. The line is read only as far as the
search asks, so a plan at 65,000 nodes looks closely at the few candidates it needs
(tests/benchmarks/bench_preemption.py). Minimal is not the fewest: the youngest first may take four 4-GPU
pods where two older 8-GPU pods elsewhere would do. So the same search runs again in single placement
windows (a node for a one-node pod, a leaf for a gang) that could need fewer victims, and the plan taken is
the one of lowest rule and priority, then the fewest pods, then the youngest victims (`Planner._fewest`).

No loop: each plan strictly improves, in this order, (1) the priorities of the running critical work, (2) the
GPUs leaf queues borrow, (3) the GPUs top-level queues borrow, (4) the priorities of all running work; so no
set of preemptions can come back to where it started (tests/core/queues/test_preemption_properties.py checks
it).
"""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import Enum

from gpuledger.core.model import MILLI_PER_GPU, Denial, Placement, Request
from gpuledger.core.nodes.node_state import Holding
from gpuledger.core.plugins.plugin import product_matches
from gpuledger.core.pods.annotation_values import PRIORITY_WORDS
from gpuledger.core.queues.gpu_queues import GPUQueue, QueueSet
from gpuledger.core.queues.ledger_view import LedgerView
from gpuledger.core.queues.quotas import Capacity, Usage, Use, gpus_text, quota_refusal

CRITICAL = PRIORITY_WORDS["critical"]
PASSED_OVER_SHOWN = 20  # workloads named in a NoPlan's passed_over (the rest are counted)
WINDOWS_TRIED = 16  # placement windows searched for a plan with fewer victims than the line's, at most


class Rule(str, Enum):
    RECLAIM = "reclaim"  # its queue borrows what the preemptor's queue lent
    PRIORITY = "priority"  # lower priority in the preemptor's own queue
    CRITICAL = "critical"  # critical work across queues, allowed by the preemptor's queue


_RULE_ORDER = {Rule.RECLAIM: 0, Rule.PRIORITY: 1, Rule.CRITICAL: 2}


@dataclass(frozen=True)
class Running:
    """A running workload as a victim: a pod, or a gang's pods together (evicted whole or not at all)."""

    key: str
    queue: str
    priority: int
    started: float
    holders: tuple[str, ...]  # the ledger's reservation ids of its pods
    use: Use  # what it holds (LedgerView.use_of)
    pods: int = 1
    budgets: tuple[tuple[str, int], ...] = ()  # (PodDisruptionBudget "ns/name", its pods that budget covers)
    grace_s: float = 30.0  # the longest terminationGracePeriodSeconds of its pods


@dataclass(frozen=True)
class Preemptor:
    key: str
    queue: str
    request: Request  # its first pod's (a gang's with its GroupSpec); request.priority orders it
    never: bool = False  # preemptionPolicy: Never


@dataclass(frozen=True)
class Victim:
    workload: Running
    rule: Rule
    why: str


@dataclass(frozen=True)
class Plan:
    preemptor: str
    victims: tuple[Victim, ...]  # empty: it fits now, nothing to evict
    placement: Placement  # where the preemptor goes once the victims are gone
    ready_by: float  # when the last victim's grace ends, at the latest

    @property
    def freed_milli(self) -> int:
        return sum(v.workload.use.milli for v in self.victims)


@dataclass(frozen=True)
class NoPlan:
    preemptor: str
    reason: str
    passed_over: tuple[tuple[str, str], ...] = ()  # (workload, why it is no victim), the first few
    passed_over_count: int = 0


class _Candidate:
    """A workload that may be a victim: its rules, its rank among victims, what it frees where (read from the
    ledger once, when first asked)."""

    __slots__ = ("run", "rules", "rank", "_view", "_nodes", "_holdings")

    def __init__(
        self, run: Running, rules: tuple[Rule, ...], rank: tuple[int, int, float, str], view: LedgerView
    ):
        self.run, self.rules, self.rank, self._view = run, rules, rank, view
        self._nodes: dict[str, int] | None = None
        self._holdings: list[Holding] | None = None

    @property
    def nodes(self) -> dict[str, int]:
        """Node -> milli-GPUs evicting it frees there."""
        if self._nodes is None:
            self._nodes = self._view.nodes_of(self.run.holders)
        return self._nodes

    @property
    def holdings(self) -> list[Holding]:
        if self._holdings is None:
            self._holdings = self._view.holdings(self.run.holders)
        return self._holdings


class _Line:
    """Victims in the order they are taken, read as far as the search asks and no further, so a plan at
    65,000 nodes judges the few candidates it needs.

    Candidates come off a heap in rank order (reclaimed before preempted before critical, lower priority
    first, the youngest first), each adding what it frees to the room of the nodes it holds GPUs on (nodes of
    the product planned for). When a node has room for one more pod of the preemptor, the candidates that
    made it are taken, each once and with the rule that allows it as the ones before it are gone (a queue
    stops borrowing; a PodDisruptionBudget runs out). A node's room is counted from its free GPUs."""

    def __init__(
        self,
        planner: Planner,
        preemptor: Preemptor,
        candidates: list[_Candidate],
        product: str,
        budgets: Mapping[str, int],
        blocked: dict[str, str],
        order: Callable[[_Candidate], tuple] | None = None,
    ):
        self.planner, self.preemptor, self.budgets, self.blocked = planner, preemptor, budgets, blocked
        req = preemptor.request
        self.product = product
        self.whole = req.gpus > 0
        self.per_pod = req.gpus * MILLI_PER_GPU if req.gpus else max(1, req.gpu_milli)
        self.pods = req.group.size if req.group is not None and req.group.size > 1 else 1
        self.heap = [(c.rank if order is None else order(c), i) for i, c in enumerate(candidates)]
        heapq.heapify(self.heap)
        self.candidates = candidates
        self.room: dict[str, int] = {}  # node -> milli-GPUs free and freed so far (absent: not read yet)
        self.fitted: dict[str, int] = {}  # node -> pods of the preemptor that room holds (-1: other product)
        self.waiting: dict[str, list[_Candidate]] = {}  # node -> candidates not yet enough for one more pod
        self.items: list[tuple[_Candidate, Rule]] = []
        self.usage = planner.usage.copy()
        self.spent: dict[str, int] = {}
        self.seen: set[str] = set()

    def extend_to(self, k: int) -> int:
        """Expand to `k` victims if there are as many; how many there are."""
        heap, pods, per_pod = self.heap, self.pods, self.per_pod
        while len(self.items) < k and heap:
            _, i = heapq.heappop(heap)
            c = self.candidates[i]
            if self._breaks_budget(c):
                continue
            for node, milli in c.nodes.items():
                fitted = self.fitted.get(node)
                if fitted is None:
                    fitted = self._read(node)
                if fitted < 0 or fitted >= pods:
                    continue
                room = self.room[node] + milli
                self.room[node] = room
                self.waiting.setdefault(node, []).append(c)
                if room >= (fitted + 1) * per_pod:
                    self.fitted[node] = min(pods, room // per_pod)
                    for x in self.waiting.pop(node):
                        self._take(x)
        return min(k, len(self.items))

    def _read(self, node: str) -> int:
        product, whole, milli = self.planner.view.node_room(node)
        if product != self.product:
            self.fitted[node] = -1
            return -1
        room = whole * MILLI_PER_GPU if self.whole else milli
        self.room[node] = room
        self.fitted[node] = fitted = min(self.pods, room // self.per_pod)
        return fitted

    def _breaks_budget(self, c: _Candidate) -> bool:
        spent, budgets = self.spent, self.budgets
        for b, n in c.run.budgets:
            if spent.get(b, 0) + n > budgets.get(b, 0):
                self.blocked[c.run.key] = (
                    f"evicting it would break PodDisruptionBudget {b} (it allows {budgets.get(b, 0)} "
                    f"disruption(s), {spent.get(b, 0)} planned before it)"
                )
                return True
        return False

    def _take(self, c: _Candidate) -> None:
        key = c.run.key
        if key in self.seen:
            return
        self.seen.add(key)
        if self._breaks_budget(c):
            return
        rule = self.planner._rule_now(self.preemptor, c, self.usage)
        if rule is None:
            self.blocked[key] = "its queue borrows no more once the victims before it are gone"
            return
        for b, n in c.run.budgets:
            self.spent[b] = self.spent.get(b, 0) + n
        self.usage.add(c.run.queue, c.run.use, -1)
        self.items.append((c, rule))


class Planner:
    """Plans one preemption at a time over a fixed state: queues, what runs (usage), capacity, the ledger."""

    def __init__(self, queues: QueueSet, usage: Usage, capacity: Capacity, view: LedgerView):
        self.queues, self.usage, self.capacity, self.view = queues, usage, capacity, view
        # preemptor key -> (the preemptor, (queue, priority, use) -> the rules `_rules_of` found)
        self._memo: dict[str, tuple[Preemptor, dict[tuple, tuple[tuple[Rule, ...], str]]]] = {}

    # ------------------------------------------------------------------------------------------ the plan
    def plan(
        self,
        preemptor: Preemptor,
        running: Iterable[Running],
        budgets: Mapping[str, int],
        now: float,
    ) -> Plan | NoPlan:
        """Victims whose eviction lets the preemptor run where the ledger would place it, or why none."""
        req, key = preemptor.request, preemptor.key
        if preemptor.queue not in self.queues:
            return NoPlan(key, f"queue {preemptor.queue} does not exist")
        first = self._check(preemptor, [])
        if isinstance(first, tuple):
            return Plan(key, (), first[0], now)
        if preemptor.never:
            return NoPlan(key, f"preemptionPolicy is Never: it waits for GPUs to free ({first})")
        candidates, passed = self._candidates(preemptor, running, now)
        shown = tuple(passed[:PASSED_OVER_SHOWN])
        if not candidates:
            return NoPlan(key, f"no running workload may be preempted for it ({first})", shown, len(passed))
        best: tuple[tuple, Plan] | None = None
        last = f"no candidate holds GPUs of a product it may use ({first})"
        blocked: dict[str, str] = {}
        for product in self._products(req):
            line = _Line(self, preemptor, candidates, product, budgets, blocked)
            found = self._search(preemptor, line, now, product)
            if isinstance(found, str):
                last = found
                continue
            found = self._fewest(preemptor, candidates, product, budgets, now, found)
            cost = (
                max(_RULE_ORDER[v.rule] for v in found.victims),
                max(v.workload.priority for v in found.victims),
                sum(v.workload.pods for v in found.victims),
                found.freed_milli,
            )
            if best is None or cost < best[0]:
                best = (cost, found)
        if best is None:
            passed += sorted(blocked.items())
            shown = tuple(passed[:PASSED_OVER_SHOWN])
            return NoPlan(key, f"no set of victims lets it run: {last}", shown, len(passed))
        return best[1]

    # ------------------------------------------------------------------------------------------ candidates
    def _candidates(
        self, preemptor: Preemptor, running: Iterable[Running], now: float
    ) -> tuple[list[_Candidate], list[tuple[str, str]]]:
        out: list[_Candidate] = []
        passed: list[tuple[str, str]] = []
        for run in running:
            if run.key == preemptor.key:
                continue
            possible, why = self._rules_for(preemptor, run, now)
            if not possible:
                passed.append((run.key, why))
                continue
            rank = (_RULE_ORDER[possible[0]], run.priority, -run.started, run.key)
            out.append(_Candidate(run, possible, rank, self.view))
        return out, passed

    def _rules_for(self, preemptor: Preemptor, run: Running, now: float) -> tuple[tuple[Rule, ...], str]:
        """The rules that may let the preemptor take `run`'s GPUs as things stand (before any other victim is
        chosen), or none and why."""
        queues = self.queues
        if run.queue not in queues:
            return (), f"its queue {run.queue} does not exist"
        victim_rules = queues[run.queue].preemption
        if now - run.started < victim_rules.min_run_s:
            return (), (
                f"it has run {now - run.started:.0f} s, less than queue {run.queue}'s minimum run time "
                f"({victim_rules.min_run_s:.0f} s)"
            )
        memo = self._memo.get(preemptor.key)
        if memo is None or memo[0] is not preemptor:
            memo = self._memo[preemptor.key] = (preemptor, {})
        memo_key = (run.queue, run.priority, run.use.parts)
        known = memo[1].get(memo_key)
        if known is None:
            known = memo[1][memo_key] = self._rules_of(preemptor, run)
        return known

    def _rules_of(self, preemptor: Preemptor, run: Running) -> tuple[tuple[Rule, ...], str]:
        """`_rules_for` but for the run time: the same for every workload of one queue, priority, products."""
        queues, own = self.queues, preemptor.queue
        rules = queues[own].preemption
        p = preemptor.request.priority
        if run.queue == own:
            if not rules.within_queue:
                return (), f"queue {own} does not preempt within itself"
            if run.priority >= p:
                return (), f"its priority {run.priority} is not below {p}"
            return (Rule.PRIORITY,), ""
        if run.priority >= CRITICAL and run.priority >= p:
            return (), f"it is critical work (priority {run.priority}), taken only by higher priority"
        possible: list[Rule] = []
        theirs, _ = queues.siblings_level(run.queue, own)
        if rules.reclaim and self._borrows(self.usage, theirs, run.use):
            possible.append(Rule.RECLAIM)
        if p >= CRITICAL and rules.critical_across_queues and run.priority < p:
            possible.append(Rule.CRITICAL)
        if possible:
            return tuple(possible), ""
        if not rules.reclaim:
            return (), f"queue {own} does not reclaim"
        return (), f"queue {theirs} borrows none of what it holds"

    def verify(
        self, preemptor: Preemptor, victims: Iterable[Victim], budgets: Mapping[str, int], now: float
    ) -> str | None:
        """None when evicting `victims` (in this order) lets the preemptor run by the rules and the ledger;
        else what fails. The planner's plans pass; tests ask it of every plan less one victim."""
        chosen: list[tuple[_Candidate, Rule]] = []
        usage = self.usage.copy()
        spent: dict[str, int] = {}
        for v in victims:
            possible, why = self._rules_for(preemptor, v.workload, now)
            if v.rule not in possible:
                return f"{v.workload.key} is no victim by the rule {v.rule.value}: {why or 'not here'}"
            for b, n in v.workload.budgets:
                spent[b] = spent.get(b, 0) + n
                if spent[b] > budgets.get(b, 0):
                    return f"{v.workload.key} would break PodDisruptionBudget {b}"
            c = _Candidate(v.workload, possible, (0, 0, 0.0, ""), self.view)
            rule = self._rule_now(preemptor, c, usage)
            if rule is None:
                return f"{v.workload.key}: its queue no longer borrows once the victims before it are gone"
            usage.add(v.workload.queue, v.workload.use, -1)
            chosen.append((c, rule))
        found = self._check(preemptor, chosen)
        return found if isinstance(found, str) else None

    def _borrows(self, usage: Usage, queue: str, use: Use) -> bool:
        q = self.queues[queue]
        return any(
            usage.borrowed(queue, q.bucket(product)) > 0 for product, milli, _, _ in use.parts if milli
        )

    def _products(self, req: Request) -> list[str]:
        """The GPU products the preemptor may run on, the most GPUs first."""
        products = self.capacity.products
        wanted = [p for p, cap in products.items() if cap.milli and product_matches(req.product, p)]
        return sorted(wanted, key=lambda p: (-products[p].milli, p))

    def _rule_now(self, preemptor: Preemptor, c: _Candidate, usage: Usage) -> Rule | None:
        for rule in sorted(c.rules, key=_RULE_ORDER.__getitem__):
            if rule is not Rule.RECLAIM:
                return rule
            theirs, _ = self.queues.siblings_level(c.run.queue, preemptor.queue)
            if self._borrows(usage, theirs, c.run.use):
                return rule
        return None

    # ------------------------------------------------------------------------------------------ the search
    def _search(self, preemptor: Preemptor, line: _Line, now: float, product: str) -> Plan | str:
        """The shortest prefix of the line that lets the preemptor run, cut down to a minimal set."""
        k, bad = 1, 0
        while True:
            n = line.extend_to(k)
            if n == 0:
                return f"no candidate on {product} nodes could make room (see passed_over)"
            found = self._check(preemptor, line.items[:n])
            if isinstance(found, tuple):
                break
            if n < k:
                return f"even with all {n} candidate(s) on {product} nodes gone: {found}"
            bad, k = n, n * 2
        lo, hi = bad, n
        while hi - lo > 1:
            mid = (lo + hi) // 2
            at_mid = self._check(preemptor, line.items[:mid])
            if isinstance(at_mid, tuple):
                hi, found = mid, at_mid
            else:
                lo = mid
        chosen = line.items[:hi]
        placement = found[0]
        used = {placement.node, *(s.node for s in placement.group_plan)}
        needed = [v for v in chosen if any(h.node in used for h in v[0].holdings)]
        if len(needed) < len(chosen):
            trial = self._check(preemptor, needed)
            if isinstance(trial, tuple):
                chosen, found = needed, trial
        for victim in reversed(list(chosen)):
            rest = [v for v in chosen if v is not victim]
            trial = self._check(preemptor, rest)
            if isinstance(trial, tuple):
                chosen, found = rest, trial
        placement, victims = found
        ready = now + max((v.workload.grace_s for v in victims), default=0.0)
        return Plan(preemptor.key, victims, placement, ready)

    # ------------------------------------------------------------------------------------------ the fewest
    def _fewest(
        self,
        preemptor: Preemptor,
        candidates: list[_Candidate],
        product: str,
        budgets: Mapping[str, int],
        now: float,
        best: Plan,
    ) -> Plan:
        """The plan with the fewest victims among the line's (`best`) and those found in one placement window
        each: a node for a one-node pod, a leaf for a gang. The line takes the youngest first, so its plan is
        minimal (no victim can be dropped) but may evict four 4-GPU pods of one leaf where two 8-GPU pods of
        another would do. A window is searched only while the fewest victims it could need (counted from the
        GPUs free and freed on the nodes its candidates hold there) is below the best plan's pods, the most
        promising first, at most WINDOWS_TRIED; in a window, within one rule and priority, the candidates
        freeing the most GPUs there come first. Plans compare by `_cost`."""
        best_cost = _cost(best)
        if best_cost[2] <= 1:
            return best
        req = preemptor.request
        gang = req.group is not None and req.group.size > 1
        per_pod = req.gpus * MILLI_PER_GPU if req.gpus else max(1, req.gpu_milli)
        need = per_pod * (req.group.size if req.group is not None and gang else 1)
        ceiling = best_cost[:2]  # a victim of higher rule and priority makes no better plan
        eligible = [c for c in candidates if c.rank[:2] <= ceiling]
        # no window can do better when even the largest candidates anywhere are too few: checked before
        # reading where each candidate is (a walk of every candidate's holdings)
        cap = self.capacity.products.get(product)
        have = cap.free_milli if cap is not None else 0
        largest = heapq.nlargest(best_cost[2] - 1, (c.run.use.milli_of(product) for c in eligible))
        if have + sum(largest) < need:
            return best
        room, window_nodes, window_items = self._windows(eligible, product, req.gpus > 0, gang)
        bounds = _window_bounds(room, window_nodes, window_items, need, best_cost[2])
        for k, window in bounds[:WINDOWS_TRIED]:
            if k >= best_cost[2]:
                break
            frees = {id(c): m for m, c in window_items[window]}

            def biggest_first(c: _Candidate, frees: dict[int, int] = frees) -> tuple:
                return (c.rank[0], c.rank[1], -frees[id(c)], c.rank[2], c.rank[3])

            line = _Line(
                self, preemptor, [c for _, c in window_items[window]], product, budgets, {}, biggest_first
            )
            found = self._search(preemptor, line, now, product)
            if isinstance(found, Plan) and _cost(found) < best_cost:
                best, best_cost = found, _cost(found)
        return best

    def _windows(
        self, eligible: list[_Candidate], product: str, whole: bool, gang: bool
    ) -> tuple[dict[str, int], dict[str, set[str]], dict[str, list[tuple[int, _Candidate]]]]:
        """Where the candidates free GPUs of `product`: node -> milli-GPUs free there (-1: another product),
        window (a leaf for a gang, else a node) -> its nodes, and window -> (milli freed there, candidate)."""
        view = self.view
        room: dict[str, int] = {}
        window_nodes: dict[str, set[str]] = {}
        window_items: dict[str, list[tuple[int, _Candidate]]] = {}
        for c in eligible:
            freed: dict[str, int] = {}
            for node, milli in c.nodes.items():
                r = room.get(node)
                if r is None:
                    node_product, whole_free, milli_free = view.node_room(node)
                    r = room[node] = (
                        -1 if node_product != product else whole_free * MILLI_PER_GPU if whole else milli_free
                    )
                if r < 0:
                    continue
                window = view.leaf(node) if gang else node
                window_nodes.setdefault(window, set()).add(node)
                freed[window] = freed.get(window, 0) + milli
            for window, milli in freed.items():
                window_items.setdefault(window, []).append((milli, c))
        return room, window_nodes, window_items

    def _check(
        self, preemptor: Preemptor, chosen: list[tuple[_Candidate, Rule]]
    ) -> tuple[Placement, tuple[Victim, ...]] | str:
        """The placement and the victims with the rule that allows each, if with `chosen` gone the ledger
        places the preemptor and the quotas and rules admit it; else why not."""
        holdings = [h for c, _ in chosen for h in c.holdings]
        decision = self.view.decide_without(preemptor.request, holdings)
        if isinstance(decision, Denial):
            return decision.message
        use = self.view.use_of_placement(decision)
        queues, own = self.queues, preemptor.queue
        after = self.usage.copy()
        freed = Use()
        for c, _ in chosen:
            after.add(c.run.queue, c.run.use, -1)
            freed = freed + c.run.use
        refusal = quota_refusal(queues, after, self.capacity, own, use, freed)
        if refusal:
            return refusal
        p = preemptor.request.priority
        victims: list[Victim] = []
        for c, rule in chosen:
            run = c.run
            if rule is Rule.RECLAIM:
                theirs, mine = queues.siblings_level(run.queue, own)
                over = self._over_quota(after, use, own, mine)
                if over is None:
                    why = (
                        f"queue {theirs} borrows what queue {mine} lent; queue {mine} stays within its quota"
                    )
                    victims.append(Victim(run, rule, why))
                    continue
                if Rule.CRITICAL not in c.rules:
                    return f"reclaiming {run.key} needs queue {over} to stay within its quota once it runs"
                rule = Rule.CRITICAL
            if rule is Rule.CRITICAL:
                why = f"critical priority {p} over {run.priority}, allowed across queues by queue {own}"
                victims.append(Victim(run, rule, why))
                continue
            grows = self._borrows_more(after, use, own)
            if grows is not None:
                return f"preempting within queue {own} would make queue {grows} borrow more"
            victims.append(Victim(run, rule, f"priority {run.priority} below {p} in queue {own}"))
        return decision, tuple(victims)

    def _over_quota(self, after: Usage, use: Use, own: str, up_to: str) -> str | None:
        """The first queue from `own` up to `up_to` that `use` would take above its quota, or None."""
        for name in self.queues.path(own):
            q = self.queues[name]
            for bucket in sorted({q.bucket(product) for product, _, _, _ in use.parts}):
                if (
                    after.milli(name, bucket) + _bucket_milli(q, use, bucket)
                    > q.quota(bucket).gpus * MILLI_PER_GPU
                ):
                    return name
            if name == up_to:
                break
        return None

    def _borrows_more(self, after: Usage, use: Use, own: str) -> str | None:
        """The first queue on `own`'s path that would borrow more than it does now, or None."""
        for name in self.queues.path(own):
            q = self.queues[name]
            for bucket in sorted({q.bucket(product) for product, _, _, _ in use.parts}):
                now_used = self.usage.milli(name, bucket)
                then = after.milli(name, bucket) + _bucket_milli(q, use, bucket)
                if then > max(q.quota(bucket).gpus * MILLI_PER_GPU, now_used):
                    return name
        return None


def _window_bounds(
    room: dict[str, int],
    window_nodes: dict[str, set[str]],
    window_items: dict[str, list[tuple[int, _Candidate]]],
    need: int,
    most: int,
) -> list[tuple[int, str]]:
    """(the fewest victims a window could need, window), fewest first, for the windows that could hold the
    preemptor with fewer than `most` victims: counted from the GPUs free there and freed, largest first."""
    bounds: list[tuple[int, str]] = []
    for window, items in window_items.items():
        have = sum(room[n] for n in window_nodes[window])
        k = 0
        for milli in sorted((m for m, _ in items), reverse=True):
            if have >= need:
                break
            have, k = have + milli, k + 1
        if have >= need and k < most:
            bounds.append((k, window))
    bounds.sort()
    return bounds


def _cost(plan: Plan) -> tuple:
    """How much a plan takes, least first: its highest rule and priority, its pods, its workloads, then its
    victims in rank order (the youngest first), so of two plans of as many pods the line's order decides."""
    victims = plan.victims
    ranks = sorted(
        (_RULE_ORDER[v.rule], v.workload.priority, -v.workload.started, v.workload.key) for v in victims
    )
    return (
        max((r[0] for r in ranks), default=-1),
        max((r[1] for r in ranks), default=-(2**31)),
        sum(v.workload.pods for v in victims),
        len(victims),
        ranks,
    )


def _bucket_milli(queue: GPUQueue, use: Use, bucket: str) -> int:
    return sum(milli for product, milli, _, _ in use.parts if queue.bucket(product) == bucket)


def describe_plan(plan: Plan | NoPlan) -> str:
    """One line for an Event or `gpuledger explain`."""
    if isinstance(plan, NoPlan):
        return f"{plan.preemptor} cannot preempt: {plan.reason}"
    if not plan.victims:
        return f"{plan.preemptor} fits without preempting anything"
    parts = [
        f"{v.workload.key} ({gpus_text(v.workload.use.milli)} GPU(s); {v.rule.value}: {v.why})"
        for v in plan.victims
    ]
    return f"{plan.preemptor} preempts {len(plan.victims)} workload(s): " + "; ".join(parts)
