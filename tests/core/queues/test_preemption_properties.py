"""Property tests of the preemption planner on random clusters, queues and workloads, with the real ledger.

Each plan: leaves the ledger as it was; is minimal (the ledger refuses the preemptor with any one victim
kept); evicts whole workloads (every slot of a gang goes); breaks no PodDisruptionBudget; takes no workload
younger than its queue's minimum run time; gives each victim a rule that holds; and the ledger, once the
victims are gone, places the preemptor exactly where the plan said.

No loop: random queues and arrivals are scheduled to the end (fair order; a workload that does not fit plans
a preemption; victims wait again). Every preemption strictly improves the planner's measure (the critical
work running, then the GPUs leaf and top-level queues borrow, then the priorities running), so no state
comes back, the run ends, and no two workloads take GPUs back from each other.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpuledger.core.model import Placement
from gpuledger.core.pods.annotation_values import PRIORITY_WORDS
from gpuledger.core.queues.fair_share import WaitingWorkload, next_waiting
from gpuledger.core.queues.gpu_queues import ANY_PRODUCT, GPUQueue, PreemptionRules, ProductQuota, QueueSet
from gpuledger.core.queues.preemption import CRITICAL, NoPlan, Planner, Preemptor, Rule, Running
from gpuledger.core.queues.quotas import Usage, Use
from tests.core.queue_factory import Cluster, gpu_node, workload_request

PRIORITIES = [PRIORITY_WORDS[w] for w in ("low", "medium", "high", "critical")]
NOW = 1000.0

cluster_spec = st.fixed_dictionaries(
    {
        "nodes": st.integers(2, 5),
        "gpus": st.sampled_from([4, 8]),
        "per_leaf": st.sampled_from([1, 2, 3]),
        "two_products": st.booleans(),
    }
)
queue_spec = st.fixed_dictionaries(
    {
        "quota": st.sampled_from([0, 0, 4, 8, 16, 24]),
        "borrowing": st.sampled_from([None, None, 0, 4]),
        "lending": st.sampled_from([None, None, 0]),
        "weight": st.sampled_from([1.0, 2.0]),
        "min_run": st.sampled_from([0.0, 0.0, 500.0]),
        "critical": st.booleans(),
        "within": st.booleans() | st.just(True),
    }
)
work_spec = st.fixed_dictionaries(
    {
        "queue": st.sampled_from([0, 0, 0, 1, 1, 2]),
        "gpus": st.sampled_from([1, 2, 4, 4, 8, 8]),
        "pods": st.sampled_from([1, 1, 2]),
        "priority": st.sampled_from(PRIORITIES),
        "started": st.sampled_from([0.0, 800.0, 990.0]),
        "budget": st.sampled_from([None, None, "pdb-1", "pdb-2"]),
        "product": st.sampled_from([None, None, "H100"]),
    }
)


def build_cluster(spec) -> Cluster:
    return Cluster.of(
        [
            gpu_node(
                f"n{i}",
                spec["gpus"],
                leaf=f"l{i // spec['per_leaf']}",
                product="A100" if spec["two_products"] and i % 2 else "H100",
            )
            for i in range(spec["nodes"])
        ]
    )


def build_queues(specs, tree: bool) -> QueueSet:
    """Three leaf queues q0, q1, q2; with `tree`, q0 and q1 are teams of the organisation org."""
    queues = []
    for i, s in enumerate(specs):
        queues.append(
            GPUQueue(
                f"q{i}",
                (ProductQuota(ANY_PRODUCT, s["quota"], s["borrowing"], s["lending"]),),
                weight=s["weight"],
                parent="org" if tree and i < 2 else None,
                preemption=PreemptionRules(
                    within_queue=s["within"], critical_across_queues=s["critical"], min_run_s=s["min_run"]
                ),
            )
        )
    if tree:
        queues.append(GPUQueue("org", (ProductQuota(ANY_PRODUCT, specs[0]["quota"] + specs[1]["quota"]),)))
    return QueueSet(queues)


def start_all(c: Cluster, works) -> None:
    for i, w in enumerate(works):
        c.start(
            f"w{i}",
            f"q{w['queue']}",
            w["gpus"],
            w["pods"],
            priority=w["priority"],
            started=w["started"],
            budgets=((w["budget"], w["pods"]),) if w["budget"] else (),
            product=w["product"],
        )


def planner(c: Cluster, qs: QueueSet) -> Planner:
    return Planner(qs, Usage.of(qs, [(r.queue, r.use) for r in c.running]), c.view.capacity(), c.view)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cluster_spec,
    st.lists(queue_spec, min_size=3, max_size=3),
    st.booleans(),
    st.lists(work_spec, min_size=3, max_size=14),
    work_spec.map(lambda w: dict(w, queue=w["queue"] % 2 + 1)),  # q1 or q2: mostly not where the work runs
    st.booleans(),
    st.fixed_dictionaries({"pdb-1": st.integers(0, 2), "pdb-2": st.integers(0, 3)}),
)
def test_plans_are_minimal_whole_and_respect_the_rules(cspec, qspecs, tree, works, ask, never, budgets):
    c = build_cluster(cspec)
    qs = build_queues(qspecs, tree)
    start_all(c, works)
    who = Preemptor(
        "preemptor",
        f"q{ask['queue']}",
        workload_request(
            "preemptor", ask["gpus"], ask["pods"], priority=ask["priority"], product=ask["product"]
        ),
        never=never,
    )
    check_plan(c, qs, who, budgets)


def check_plan(c: Cluster, qs: QueueSet, who: Preemptor, budgets: dict[str, int]) -> None:
    p = planner(c, qs)
    before = c.ledger.snapshot()
    plan = p.plan(who, list(c.running), budgets, NOW)
    assert c.ledger.snapshot() == before
    if isinstance(plan, NoPlan):
        event("no plan")
        return
    event(f"{len(plan.victims)} victim(s)")
    if plan.victims:
        assert not who.never
        assert p.verify(who, plan.victims, budgets, NOW) is None
        for victim in plan.victims:  # minimal
            rest = [v for v in plan.victims if v is not victim]
            assert p.verify(who, rest, budgets, NOW) is not None
        spent: dict[str, int] = {}
        for v in plan.victims:
            run = v.workload
            for b, n in run.budgets:
                spent[b] = spent.get(b, 0) + n
            assert NOW - run.started >= qs[run.queue].preemption.min_run_s
            if v.rule is Rule.PRIORITY:
                assert run.queue == who.queue and run.priority < who.request.priority
            elif v.rule is Rule.CRITICAL:
                assert who.request.priority >= CRITICAL and qs[who.queue].preemption.critical_across_queues
                assert run.priority < who.request.priority and run.queue != who.queue
            else:
                assert run.queue != who.queue
                assert run.priority < CRITICAL or run.priority < who.request.priority
        assert all(n <= budgets[b] for b, n in spent.items())
    for v in plan.victims:  # evicted whole: nothing of it is held after
        c.evict(v.workload.key)
        assert c.view.holdings(v.workload.holders) == []
    placed = c.ledger.reserve(who.request, NOW)
    assert isinstance(placed, Placement), placed
    assert replace(placed, group_deadline=None) == replace(plan.placement, group_deadline=None)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cluster_spec,
    st.lists(work_spec.map(lambda w: dict(w, gpus=min(w["gpus"], 2))), min_size=8, max_size=30),
    work_spec.map(lambda w: dict(w, gpus=max(w["gpus"], 4))),
    st.sampled_from([0.0, 500.0]),
    st.fixed_dictionaries({"pdb-1": st.integers(0, 2), "pdb-2": st.integers(0, 3)}),
)
def test_reclaim_plans_on_a_cluster_one_queue_fills(cspec, works, ask, min_run, budgets):
    """q0 (no quota) fills the cluster; q1 (half of it) submits: plans with many victims to check."""
    c = build_cluster(cspec)
    half = cspec["nodes"] * cspec["gpus"] // 2
    qs = QueueSet(
        [
            GPUQueue("q0", preemption=PreemptionRules(min_run_s=min_run)),
            GPUQueue("q1", (ProductQuota(ANY_PRODUCT, half),)),
        ]
    )
    start_all(c, [dict(w, queue=0) for w in works])
    request = workload_request(
        "preemptor", ask["gpus"], ask["pods"], priority=ask["priority"], product=ask["product"]
    )
    check_plan(c, qs, Preemptor("preemptor", "q1", request), budgets)


def measure(qs: QueueSet, running: list[Running]):
    """What every preemption strictly improves (larger is better), as the planner's docstring says."""
    usage = Usage.of(qs, [(r.queue, r.use) for r in running])
    leaf_borrowed = sum(usage.borrowed_total(q) for q in qs.leaves())
    top_borrowed = sum(usage.borrowed_total(q) for q in qs.top_level())
    critical = tuple(sorted((r.priority for r in running if r.priority >= CRITICAL), reverse=True))
    everyone = tuple(sorted((r.priority for r in running), reverse=True))
    return (critical, -leaf_borrowed, -top_borrowed, everyone)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    cluster_spec,
    st.lists(queue_spec, min_size=3, max_size=3),
    st.booleans(),
    st.lists(work_spec, min_size=2, max_size=14),
    st.booleans(),
)
def test_no_preemption_loop_on_random_queues_and_arrivals(cspec, qspecs, tree, works, q0_first):
    c = build_cluster(cspec)
    qs = build_queues(qspecs, tree)
    if q0_first:  # q0's work arrives first and borrows what the others then take back
        works = sorted(works, key=lambda w: w["queue"])
    asks = {
        f"w{i}": workload_request(f"w{i}", w["gpus"], w["pods"], priority=w["priority"], product=w["product"])
        for i, w in enumerate(works)
    }
    queue_of = {f"w{i}": f"q{w['queue']}" for i, w in enumerate(works)}
    waiting: dict[str, WaitingWorkload] = {}
    pairs: set[tuple[str, str]] = set()
    seen_at_preemption: set[frozenset[str]] = set()
    steps = 0
    for arrival, key in enumerate(asks):  # one arrives, then everything is scheduled until nothing moves
        waiting[key] = WaitingWorkload(key, queue_of[key], asks[key].priority, float(arrival))
        blocked: set[str] = set()
        while True:
            usage = Usage.of(qs, [(r.queue, r.use) for r in c.running])
            capacity = c.view.capacity()
            nxt = next_waiting(qs, usage, capacity, [w for k, w in waiting.items() if k not in blocked])
            if nxt is None:
                break
            steps += 1
            assert steps < 300, "the schedule does not end"
            req = asks[nxt.key]
            who = Preemptor(nxt.key, nxt.queue, req)
            plan = Planner(qs, usage, capacity, c.view).plan(who, list(c.running), {}, NOW)
            if isinstance(plan, NoPlan):
                blocked.add(nxt.key)
                continue
            before = measure(qs, c.running)
            for v in plan.victims:
                c.evict(v.workload.key)
                waiting[v.workload.key] = WaitingWorkload(
                    v.workload.key, v.workload.queue, v.workload.priority, -1.0
                )
                pairs.add((nxt.key, v.workload.key))
            placed = c.ledger.reserve(req, NOW)
            assert isinstance(placed, Placement), placed
            use: Use = c.view.use_of([req.id])
            c.running.append(Running(nxt.key, nxt.queue, req.priority, 0.0, (req.id,), use))
            del waiting[nxt.key]
            blocked.clear()  # something changed: every waiting workload may try again
            if plan.victims:
                after = measure(qs, c.running)
                assert after > before, (before, after, plan)
                state = frozenset(r.key for r in c.running)
                assert state not in seen_at_preemption
                seen_at_preemption.add(state)
    event(f"{len(pairs)} preemption(s)")
    for a, b in pairs:
        assert (b, a) not in pairs, f"{a} and {b} took GPUs back from each other"
