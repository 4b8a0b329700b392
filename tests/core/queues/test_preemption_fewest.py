"""The fewest victims: a plan evicts the fewest pods that let the preemptor run where the ledger would place
it, not the shortest run of the youngest; of two plans of as many pods, the youngest victims."""

from __future__ import annotations

from gpuledger.core.queues.gpu_queues import GPUQueue, QueueSet
from gpuledger.core.queues.preemption import Plan, Rule
from tests.core.queue_factory import Cluster, nodes
from tests.core.queues.test_preemption import CRITICAL, LOW, apply, plan_for, preemptor, quota


def one_team() -> QueueSet:
    return QueueSet([GPUQueue("team", quota(128))])


def test_a_gang_takes_two_large_pods_of_one_leaf_over_four_younger_small_ones_of_another():
    """Leaf nl0: eight 8-GPU pods (the older); leaf nl1: sixteen 4-GPU pods (the younger); the cluster full.
    A critical 2 x 8-GPU gang: two of nl0's pods open a leaf window, where the youngest first would take four
    of nl1's."""
    c = Cluster.of(nodes(16, 8, per_leaf=8))
    bigs = [c.start(f"pod/t/big-{i}", "team", 8, priority=LOW, started=float(i)) for i in range(8)]
    halves = [c.start(f"pod/t/half-{i}", "team", 4, priority=LOW, started=100.0 + i) for i in range(16)]
    assert all(bigs) and all(halves) and c.free_gpus() == 0
    leaf_of = {n.name: n.leaf for n in nodes(16, 8, per_leaf=8)}
    big_leaves = {leaf_of[n] for b in bigs if b is not None for n in c.view.nodes_of(b.holders)}
    assert len(big_leaves) == 1
    who = preemptor("job/t/urgent", "team", 8, 2, priority=CRITICAL)
    plan = plan_for(c, QueueSet([GPUQueue("team", quota(128))]), who)
    assert isinstance(plan, Plan), plan
    assert len(plan.victims) == 2
    assert {v.workload.key for v in plan.victims} <= {b.key for b in bigs if b is not None}
    assert {v.workload.key for v in plan.victims} == {"pod/t/big-7", "pod/t/big-6"}  # the youngest of them
    assert all(v.rule is Rule.PRIORITY for v in plan.victims)
    placed = apply(c, who, plan)
    assert {leaf_of[s.node] for s in placed.group_plan} == big_leaves


def test_a_pod_takes_one_large_pod_over_eight_younger_small_ones_on_another_node():
    c = Cluster.of(nodes(2, 8, per_leaf=8))
    old = c.start("pod/t/old", "team", 8, priority=LOW, started=0.0)
    smalls = [c.start(f"pod/t/s{i}", "team", 1, priority=LOW, started=100.0 + i) for i in range(8)]
    assert old is not None and all(smalls) and c.free_gpus() == 0
    who = preemptor("pod/t/new", "team", 8, priority=CRITICAL)
    plan = plan_for(c, one_team(), who)
    assert isinstance(plan, Plan), plan
    assert [v.workload.key for v in plan.victims] == ["pod/t/old"]
    apply(c, who, plan)


def test_of_as_many_victims_the_youngest_still_go():
    """Eight 8-GPU pods over two leaves, all alike but their age: a 2 x 8 gang takes the two youngest (the
    line's plan), not two others that would open a leaf window as well."""
    c = Cluster.of(nodes(8, 8, per_leaf=4))
    for i in range(8):
        assert c.start(f"pod/t/p{i}", "team", 8, priority=LOW, started=float(i)) is not None
    who = preemptor("job/t/urgent", "team", 8, 2, priority=CRITICAL)
    plan = plan_for(c, one_team(), who)
    assert isinstance(plan, Plan), plan
    assert {v.workload.key for v in plan.victims} == {"pod/t/p7", "pod/t/p6"}


def test_a_lower_priority_victim_still_beats_fewer_higher_priority_ones():
    """Fewest counts among plans of the same highest rule and priority: four low-priority 2-GPU pods go
    before one medium-priority 8-GPU pod."""
    c = Cluster.of(nodes(2, 8, per_leaf=8))
    mid = c.start("pod/t/mid", "team", 8, priority=0, started=0.0)
    lows = [c.start(f"pod/t/l{i}", "team", 2, priority=LOW, started=100.0 + i) for i in range(4)]
    assert mid is not None and all(lows) and c.free_gpus() == 0
    who = preemptor("pod/t/new", "team", 8, priority=CRITICAL)
    plan = plan_for(c, one_team(), who)
    assert isinstance(plan, Plan), plan
    assert sorted(v.workload.key for v in plan.victims) == [f"pod/t/l{i}" for i in range(4)]
