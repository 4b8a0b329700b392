"""The preemption planner, one rule at a time, on a real ledger: reclaim from queues above their quota,
lower priority within a queue, critical work across queues where allowed; whole gangs, minimal plans proven
by the ledger, PodDisruptionBudgets, `preemptionPolicy: Never`, minimum run times; the issue's two-team
scenario in pure form."""

from __future__ import annotations

from dataclasses import replace

from gpuledger.core.model import MILLI_PER_GPU, Placement
from gpuledger.core.pods.annotation_values import PRIORITY_WORDS
from gpuledger.core.queues.gpu_queues import ANY_PRODUCT, GPUQueue, PreemptionRules, ProductQuota, QueueSet
from gpuledger.core.queues.preemption import NoPlan, Plan, Planner, Preemptor, Rule, Running, describe_plan
from gpuledger.core.queues.quotas import Usage
from tests.core.queue_factory import Cluster, gpu_node, nodes, workload_request

G = MILLI_PER_GPU
CRITICAL, HIGH, LOW = PRIORITY_WORDS["critical"], PRIORITY_WORDS["high"], PRIORITY_WORDS["low"]
NOW = 10_000.0


def quota(gpus: int, **kw) -> tuple[ProductQuota, ...]:
    return (ProductQuota(ANY_PRODUCT, gpus, **kw),)


def planner(c: Cluster, qs: QueueSet) -> Planner:
    usage = Usage.of(qs, [(r.queue, r.use) for r in c.running])
    return Planner(qs, usage, c.view.capacity(), c.view)


def preemptor(
    key: str, queue: str, gpus: int, pods: int = 1, *, priority: int = 0, never: bool = False, **kw
):
    return Preemptor(key, queue, workload_request(key, gpus, pods, priority=priority, **kw), never=never)


def plan_for(c: Cluster, qs: QueueSet, who: Preemptor, budgets=None) -> Plan | NoPlan:
    p = planner(c, qs)
    before = c.ledger.snapshot()
    result = p.plan(who, list(c.running), budgets or {}, NOW)
    assert c.ledger.snapshot() == before  # planning changes nothing in the ledger
    if isinstance(result, Plan) and result.victims:
        assert_minimal(c, qs, who, result, budgets or {})
    return result


def assert_minimal(c: Cluster, qs: QueueSet, who: Preemptor, plan: Plan, budgets) -> None:
    p = planner(c, qs)
    assert p.verify(who, plan.victims, budgets, NOW) is None
    for victim in plan.victims:
        rest = [v for v in plan.victims if v is not victim]
        assert p.verify(who, rest, budgets, NOW) is not None, f"{victim.workload.key} is not needed"


def apply(c: Cluster, who: Preemptor, plan: Plan) -> Placement:
    """Evict the victims, then place the preemptor: the ledger puts it where the plan said."""
    for v in plan.victims:
        c.evict(v.workload.key)
        assert c.view.holdings(v.workload.holders) == []  # the whole workload is gone, every slot
    placed = c.ledger.reserve(who.request, NOW)
    assert isinstance(placed, Placement), placed
    assert replace(placed, group_deadline=None) == replace(plan.placement, group_deadline=None)
    return placed


def two_teams() -> QueueSet:
    return QueueSet([GPUQueue("team-a", quota(64)), GPUQueue("team-b", quota(64))])


def lender() -> QueueSet:
    """team-b holds the whole quota; team-a has none: all it runs is borrowed."""
    return QueueSet([GPUQueue("team-a", quota(0)), GPUQueue("team-b", quota(64))])


def test_the_issue_scenario_reclaims_exactly_the_borrowed_gpus_needed_whole_gangs_only():
    """Two teams with 64 GPUs of quota each on 128 GPUs: team-a submitted 200 GPUs of work and borrows all 128
    (gangs of 2 x 8 GPUs); team-b submits 64 GPUs (a gang of 8 x 8): four of team-a's gangs are planned back,
    64 GPUs, and then both teams run at their quota."""
    c = Cluster.of(nodes(16, 8, per_leaf=8))
    qs = two_teams()
    for i in range(13):  # 13 x 16 = 208 GPUs of work; 8 gangs fit
        c.start(f"job/a/train-{i}", "team-a", 8, 2, started=float(i))
    assert len(c.running) == 8 and c.free_gpus() == 0
    who = preemptor("job/b/big", "team-b", 8, 8)
    plan = plan_for(c, qs, who)
    assert isinstance(plan, Plan), plan
    assert [v.rule for v in plan.victims] == [Rule.RECLAIM] * 4
    assert {v.workload.queue for v in plan.victims} == {"team-a"}
    assert plan.freed_milli == 64 * G
    assert all(v.workload.pods == 2 for v in plan.victims)
    assert {v.workload.key for v in plan.victims} == {
        f"job/a/train-{i}" for i in (4, 5, 6, 7)
    }  # the youngest
    apply(c, who, plan)
    usage = Usage.of(
        qs, [(r.queue, r.use) for r in c.running] + [("team-b", c.view.use_of([who.request.id]))]
    )
    assert usage.total("team-a") == usage.total("team-b") == 64 * G


def test_single_pods_are_reclaimed_one_by_one_each_plan_minimal():
    c = Cluster.of(nodes(16, 8, per_leaf=8))
    qs = two_teams()
    for i in range(16):
        c.start(f"pod/a/p{i}", "team-a", 8, started=float(i))
    for j in range(8):
        who = preemptor(f"pod/b/q{j}", "team-b", 8)
        plan = plan_for(c, qs, who)
        assert isinstance(plan, Plan) and len(plan.victims) == 1 and plan.victims[0].rule is Rule.RECLAIM
        placed = apply(c, who, plan)
        c.running.append(Running(who.key, "team-b", 0, NOW, (who.request.id,), c.view.use_of([placed.id])))
    # team-b at its quota: its next workload may not reclaim (it would borrow)
    plan = plan_for(c, qs, preemptor("pod/b/more", "team-b", 8))
    assert isinstance(plan, NoPlan) and plan.reason.startswith("no running workload may be preempted for it")


def test_a_queue_within_its_quota_is_not_reclaimed_from():
    c = Cluster.of(nodes(8, 8))
    qs = two_teams()
    for i in range(8):
        c.start(f"pod/a/p{i}", "team-a", 8)  # 64: exactly its quota
    plan = plan_for(c, qs, preemptor("pod/b/x", "team-b", 8))
    assert isinstance(plan, NoPlan)
    assert plan.passed_over_count == 8
    assert plan.passed_over[0] == ("pod/a/p0", "queue team-a borrows none of what it holds")


def test_it_fits_now_so_nothing_is_preempted():
    c = Cluster.of(nodes(2, 8))
    qs = two_teams()
    c.start("pod/a/p0", "team-a", 8)
    plan = plan_for(c, qs, preemptor("pod/b/x", "team-b", 8))
    assert isinstance(plan, Plan) and plan.victims == () and plan.placement.node == "n001"
    assert describe_plan(plan) == "pod/b/x fits without preempting anything"


def test_preemption_policy_never_waits():
    c = Cluster.of(nodes(2, 8))
    qs = two_teams()
    for i in range(2):
        c.start(f"pod/a/p{i}", "team-a", 8)
    plan = plan_for(c, qs, preemptor("pod/b/x", "team-b", 8, never=True))
    assert isinstance(plan, NoPlan) and plan.reason.startswith("preemptionPolicy is Never: it waits")


def test_lower_priority_within_the_queue_is_preempted_and_equal_priority_is_not():
    c = Cluster.of(nodes(2, 8))
    qs = QueueSet([GPUQueue("q", quota(16))])
    c.start("pod/q/low", "q", 8, priority=LOW)
    c.start("pod/q/medium", "q", 8, priority=0)
    plan = plan_for(c, qs, preemptor("pod/q/high", "q", 8, priority=HIGH))
    assert isinstance(plan, Plan) and [v.workload.key for v in plan.victims] == ["pod/q/low"]
    assert plan.victims[0].rule is Rule.PRIORITY
    assert plan.victims[0].why == f"priority {LOW} below {HIGH} in queue q"
    plan = plan_for(c, qs, preemptor("pod/q/medium2", "q", 8, priority=LOW))
    assert isinstance(plan, NoPlan)
    off = QueueSet([GPUQueue("q", quota(16), preemption=PreemptionRules(within_queue=False))])
    plan = plan_for(c, off, preemptor("pod/q/high", "q", 8, priority=HIGH))
    assert (
        isinstance(plan, NoPlan)
        and ("pod/q/low", "queue q does not preempt within itself") in plan.passed_over
    )


def test_within_a_queue_preemption_never_makes_it_borrow_more():
    """q (quota 4) runs a low-priority 4-GPU pod beside 4 free GPUs: a high-priority 8-GPU pod could run in
    their place, but q would then use 8, borrowing 4 more than it does: refused. With a quota of 8 it may."""
    c = Cluster.of(nodes(2, 8))
    c.start("pod/other/full", "other", 8)
    c.start("pod/q/low", "q", 4, priority=LOW)
    who = preemptor("pod/q/high", "q", 8, priority=HIGH)
    small = QueueSet([GPUQueue("q", quota(4)), GPUQueue("other", quota(8))])
    plan = plan_for(c, small, who)
    assert isinstance(plan, NoPlan) and "would make queue q borrow more" in plan.reason
    enough = QueueSet([GPUQueue("q", quota(8)), GPUQueue("other", quota(8))])
    plan = plan_for(c, enough, who)
    assert isinstance(plan, Plan) and [v.workload.key for v in plan.victims] == ["pod/q/low"]


def test_critical_work_crosses_queues_only_where_its_queue_allows():
    c = Cluster.of(nodes(2, 8))
    allowing = QueueSet(
        [
            GPUQueue("ops", quota(8), preemption=PreemptionRules(critical_across_queues=True)),
            GPUQueue("team", quota(16)),
        ]
    )
    c.start("pod/team/a", "team", 8, priority=HIGH)
    c.start("pod/team/b", "team", 8, priority=0, started=5.0)
    who = preemptor("pod/ops/incident", "ops", 8, priority=CRITICAL)
    plan = plan_for(c, allowing, who)
    assert isinstance(plan, Plan) and [(v.workload.key, v.rule) for v in plan.victims] == [
        ("pod/team/b", Rule.CRITICAL)
    ]
    assert plan.victims[0].why == f"critical priority {CRITICAL} over 0, allowed across queues by queue ops"
    not_allowing = QueueSet([GPUQueue("ops", quota(8)), GPUQueue("team", quota(16))])
    assert isinstance(plan_for(c, not_allowing, who), NoPlan)
    # a critical victim is taken only by strictly higher priority
    c2 = Cluster.of(nodes(1, 8))
    c2.start("pod/team/crit", "team", 8, priority=CRITICAL)
    plan = plan_for(c2, allowing, who)
    assert isinstance(plan, NoPlan)
    assert plan.passed_over[0][1].startswith("it is critical work")
    assert isinstance(plan_for(c2, allowing, preemptor("pod/ops/x", "ops", 8, priority=CRITICAL + 1)), Plan)


def test_a_workload_younger_than_its_queues_minimum_run_time_is_no_victim():
    c = Cluster.of(nodes(2, 8))
    qs = QueueSet(
        [
            GPUQueue("team-a", quota(0), preemption=PreemptionRules(min_run_s=600)),
            GPUQueue("team-b", quota(16)),
        ]
    )
    c.start("pod/a/old", "team-a", 8, started=NOW - 3600)
    c.start("pod/a/young", "team-a", 8, started=NOW - 60)
    plan = plan_for(c, qs, preemptor("pod/b/x", "team-b", 8))
    assert isinstance(plan, Plan) and [v.workload.key for v in plan.victims] == ["pod/a/old"]
    plan = plan_for(c, qs, preemptor("pod/b/y", "team-b", 16, 1))
    assert isinstance(plan, NoPlan)  # 16 GPUs on one node: no 16-GPU node
    c.evict("pod/a/old")
    c.start("pod/a/young2", "team-a", 8, started=NOW - 30)
    plan = plan_for(c, qs, preemptor("pod/b/x", "team-b", 8))
    assert isinstance(plan, NoPlan)
    assert (
        "pod/a/young",
        "it has run 60 s, less than queue team-a's minimum run time (600 s)",
    ) in plan.passed_over


def test_a_pod_disruption_budget_that_would_break_blocks_a_victim_and_the_plan_picks_another_or_waits():
    c = Cluster.of(nodes(2, 8))
    qs = lender()
    c.start("pod/a/guarded", "team-a", 8, started=100.0, budgets=(("ns-a/pdb", 1),))
    c.start("pod/a/plain", "team-a", 8, started=50.0)
    # the youngest (guarded) would go first; its budget allows no disruption, so the other goes
    plan = plan_for(c, qs, preemptor("pod/b/x", "team-b", 8), budgets={"ns-a/pdb": 0})
    assert isinstance(plan, Plan) and [v.workload.key for v in plan.victims] == ["pod/a/plain"]
    plan = plan_for(c, qs, preemptor("pod/b/x", "team-b", 8), budgets={"ns-a/pdb": 1})
    assert isinstance(plan, Plan) and [v.workload.key for v in plan.victims] == ["pod/a/guarded"]
    c.evict("pod/a/plain")
    c.start("pod/a/guarded2", "team-a", 8, budgets=(("ns-a/pdb", 1),))
    plan = plan_for(c, qs, preemptor("pod/b/x", "team-b", 8, 2), budgets={"ns-a/pdb": 1})
    assert isinstance(plan, NoPlan)  # both needed, the budget allows one: it waits


def test_a_critical_gang_preempts_the_fewest_pods_that_open_one_leaf_window():
    """Four 8-GPU nodes in two leaves, full of 4-GPU pods of low priority: a critical 2 x 8-GPU gang that must
    stay in one leaf takes the four pods of the two nodes of one leaf, and nothing else."""
    c = Cluster.of([gpu_node(f"n{i}", 8, leaf=f"leaf{i // 2}") for i in range(4)])
    qs = QueueSet([GPUQueue("q", quota(32))])
    for i in range(8):
        c.start(f"pod/q/low{i}", "q", 4, priority=LOW, started=float(i))
    who = preemptor("job/q/critical", "q", 8, 2, priority=CRITICAL, max_nodes_per_leaf=2)
    plan = plan_for(c, qs, who)
    assert isinstance(plan, Plan) and len(plan.victims) == 4
    nodes_freed = {h.node for v in plan.victims for h in c.view.holdings(v.workload.holders)}
    placed = apply(c, who, plan)
    assert nodes_freed == {s.node for s in placed.group_plan}
    assert len({c.ledger.index.nodes[n].leaf_key for n in nodes_freed}) == 1


def test_the_pdb_moves_the_gang_to_the_other_leaf():
    c = Cluster.of([gpu_node(f"n{i}", 8, leaf=f"leaf{i // 2}") for i in range(4)])
    qs = QueueSet([GPUQueue("q", quota(32))])
    for i in range(8):
        budgets = (("q/pdb", 1),) if i in (6, 7) else ()  # the youngest pods, on leaf1, are guarded
        c.start(f"pod/q/low{i}", "q", 4, priority=LOW, started=float(i), budgets=budgets)
    who = preemptor("job/q/critical", "q", 8, 2, priority=CRITICAL)
    plan = plan_for(c, qs, who, budgets={"q/pdb": 1})
    assert isinstance(plan, Plan)
    victims = {v.workload.key for v in plan.victims}
    assert len(victims) == 4 and not {"pod/q/low6", "pod/q/low7"} <= victims


def test_only_gpus_of_the_product_it_asks_for_are_taken_back():
    c = Cluster.of([gpu_node("h0", 8, product="H100"), gpu_node("a0", 8, product="A100")])
    qs = lender()
    c.start("pod/a/on-a100", "team-a", 8, product="A100", started=9.0)
    c.start("pod/a/on-h100", "team-a", 8, product="H100", started=1.0)
    plan = plan_for(c, qs, preemptor("pod/b/x", "team-b", 8, product="H100"))
    assert isinstance(plan, Plan) and [v.workload.key for v in plan.victims] == ["pod/a/on-h100"]


def test_a_team_reclaims_from_its_sibling_and_an_organisation_from_another():
    c = Cluster.of(nodes(4, 8))
    qs = QueueSet(
        [
            GPUQueue("org1", quota(16)),
            GPUQueue("t1", quota(8), parent="org1"),
            GPUQueue("t2", quota(8), parent="org1"),
            GPUQueue("org2", quota(16)),
        ]
    )
    c.start("pod/t1/a", "t1", 8, started=1.0)
    c.start("pod/t1/b", "t1", 8, started=2.0)  # t1 borrows 8 from t2, org1 at its quota
    c.start("pod/org2/a", "org2", 8, started=3.0)
    c.start("pod/org2/b", "org2", 8, started=4.0)
    plan = plan_for(c, qs, preemptor("pod/t2/x", "t2", 8))
    assert isinstance(plan, Plan) and [v.workload.key for v in plan.victims] == ["pod/t1/b"]
    assert plan.victims[0].why == "queue t1 borrows what queue t2 lent; queue t2 stays within its quota"
    # org2 within its quota: nothing of it is reclaimed by org1's teams
    assert all(v.workload.queue != "org2" for v in plan.victims)


def test_no_two_workloads_take_gpus_back_from_each_other():
    c = Cluster.of(nodes(1, 8))
    qs = QueueSet([GPUQueue("team-a", quota(0)), GPUQueue("team-b", quota(8))])
    c.start("pod/a/v", "team-a", 8)
    who = preemptor("pod/b/w", "team-b", 8)
    plan = plan_for(c, qs, who)
    assert isinstance(plan, Plan) and [v.workload.key for v in plan.victims] == ["pod/a/v"]
    apply(c, who, plan)
    c.running.append(Running("pod/b/w", "team-b", 0, NOW, (who.request.id,), c.view.use_of([who.request.id])))
    back = plan_for(c, qs, preemptor("pod/a/v", "team-a", 8))
    assert isinstance(back, NoPlan)
    assert back.passed_over == (("pod/b/w", "queue team-b borrows none of what it holds"),)
